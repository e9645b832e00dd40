"""A live rank: connect back to the kernel, then run each cell it sends in one namespace.

This is the script a Session's torchrun starts on every rank (through ddp_kit.rank.runner, so the
rank still dies with its agent and has the short collective timeout). The channel is a
multiprocessing connection on 127.0.0.1, authenticated both ways with the session's key
before any message is read; the messages, both ways, are shared.contract's table.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import linecache
import os
import signal
import sys
import threading
from dataclasses import asdict
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from .. import worker
from ..profiling import profiled
from ..shared import contract, failures
from ..shared.contract import (
    CellDone,
    Exit,
    Flush,
    Flushed,
    FreeGroups,
    Hello,
    Output,
    Pull,
    PullFailed,
    RunCell,
    Value,
)
from ..shared.processes import end_data_loader_workers
from ..shared.records import to_numpy
from . import groups, waits
from .where import Whereabouts


class Channel:
    """The connection to the kernel; sends are locked (output may come from other threads)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.lock = threading.Lock()
        self.stalled = False  # the cell's answer was sent for it (rank.waits): send no more

    def send(self, message: tuple) -> None:
        with self.lock:
            if not self.stalled:
                self.connection.send(message)

    def answer_stalled(self, failure: failures.RankFailure) -> None:
        """Answer the running (or next) cell with a stalled wait; the kernel then replaces
        the ranks, because the main thread is stuck inside torch's C++."""
        self.send(CellDone(asdict(failure)))
        self.stalled = True


class ChannelWriter(io.TextIOBase):
    """sys.stdout / sys.stderr of a live rank: every write goes to the kernel as it happens."""

    def __init__(self, channel: Channel, stream: str) -> None:
        self.channel = channel
        self.stream = stream

    @property
    def encoding(self) -> str:
        return "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            self.channel.send(Output(self.stream, text))
        return len(text)


class CellInterrupts:
    """SIGINT raises KeyboardInterrupt only while a cell runs (never in the idle loop)."""

    def __init__(self) -> None:
        self.running = False
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.running:
            raise KeyboardInterrupt("stopped from the notebook (cell_timeout or the stop button)")


def preimport() -> None:
    """Import what DDP lessons use while the ranks wait, so the first DDP(model) is fast."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (DDP's constructor imports it: seconds on a laptop)
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    import torch.utils.data.distributed  # noqa: F401


def connect() -> Channel:
    """Open the authenticated channel to the kernel and say who this rank is."""
    address = os.environ[contract.SESSION_ADDRESS]
    key = Path(os.environ[contract.SESSION_KEY_FILE]).read_bytes()
    if address.startswith("/"):  # a host's end of the kernel's ssh forward (kernel.hosts)
        connection = Client(address, family="AF_UNIX", authkey=key)
    else:
        host, port = address.rsplit(":", 1)
        connection = contract.send_at_once(Client((host, int(port)), family="AF_INET",
                                                  authkey=key))  # fmt: skip
    channel = Channel(connection)
    channel.send(Hello(worker.rank(), os.getpid()))
    return channel


def run_in_namespace(name: str, code: str, namespace: dict[str, Any]) -> None:
    """Run `code` in `namespace`, as a notebook cell: a last expression's value is printed."""
    linecache.cache[name] = (len(code), None, code.splitlines(keepends=True), name)
    tree = ast.parse(code, filename=name)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    # dont_inherit: the cell is compiled as a notebook compiles it, without this module's
    # `from __future__ import annotations` (which would make its annotations strings, and DDP
    # refuses a comm hook whose `bucket: dist.GradBucket` annotation is a string)
    exec(compile(tree, name, "exec", dont_inherit=True), namespace)
    if last is not None:
        expression = ast.Expression(last.value)
        value = eval(compile(expression, name, "eval", dont_inherit=True), namespace)
        if value is not None:
            print(repr(value))


def pullable(value: Any) -> Any:
    """A value to send to the kernel: tensors become numpy arrays (on the CPU), in lists,
    tuples and dicts too."""
    if isinstance(value, (list, tuple)):
        return type(value)(pullable(v) for v in value)
    if isinstance(value, dict):
        return {k: pullable(v) for k, v in value.items()}
    return to_numpy(value)


def serve() -> None:
    """Answer the kernel's messages until it says exit or goes away."""
    preimport()
    channel = connect()
    waits.on_stall(channel.answer_stalled)
    whereabouts = Whereabouts(channel.send)
    interrupts = CellInterrupts()
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    sys.stdout = ChannelWriter(channel, "stdout")
    sys.stderr = ChannelWriter(channel, "stderr")
    while True:
        try:
            message = channel.connection.recv()
        except (EOFError, OSError):
            break  # the kernel is gone
        if isinstance(message, Exit):
            break
        if isinstance(message, Flush):
            worker.flush()
            channel.send(Flushed())
            continue
        whereabouts.cell_started(getattr(message, "name", "<free the process groups>"))
        reply = answer(message, namespace, interrupts)
        whereabouts.cell_ended()
        channel.send(reply)
        groups.release()  # what the cell destroyed, freed while the kernel reads the reply
    _leave(channel)


def answer(
    message: RunCell | Pull | FreeGroups, namespace: dict[str, Any], interrupts: CellInterrupts
) -> tuple:
    """Run a cell, look up a variable or free the process groups, interruptibly; the reply."""
    interrupts.running = True
    try:
        if isinstance(message, RunCell):
            with profiled(message.profile) if message.profile else contextlib.nullcontext():
                run_in_namespace(message.name, message.code, namespace)
            return CellDone(None)
        if isinstance(message, FreeGroups):
            groups.free_all()
            return CellDone(None)
        return Value(pullable(namespace[message.name]))
    except BaseException as error:  # noqa: BLE001  the cell's error is the kernel's to show
        if isinstance(error, KeyError) and isinstance(message, Pull):
            error = NameError(f"name {message.name!r} is not defined on this rank")
        start = message.name if isinstance(message, RunCell) else None
        tb = failures.drop_trailing(error.__traceback__, __file__)  # the SIGINT handler
        failure = asdict(failures.from_exception(worker.rank(), error, tb, start))
        return PullFailed(failure) if isinstance(message, Pull) else CellDone(failure)
    finally:
        interrupts.running = False
        sys.stdout.flush()


def _leave(channel: Channel) -> None:
    """Write the records, leave the process group, close the channel."""
    import torch.distributed as dist

    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    end_data_loader_workers()  # while the cells' namespace is alive (shared.processes)
    worker.flush()
    if dist.is_initialized():
        dist.destroy_process_group()
    groups.release()
    channel.connection.close()
