"""A live rank: connect back to the kernel, then run each cell it sends in one namespace.

This is the script a Session's torchrun starts on every rank (through ddp_kit.rank.runner, so the
rank still dies with its agent and has the short collective timeout). The channel is a
multiprocessing connection on 127.0.0.1, authenticated both ways with the session's key
before any message is read. Messages from the kernel:

    ("run", name, code)   run code; reply ("done", failure or None); output streams meanwhile
    ("pull", name)        reply ("value", the variable, tensors as numpy) or ("done", failure)
    ("flush",)            write this rank's records; reply ("flushed",)
    ("exit",)             leave the process group and end
"""

from __future__ import annotations

import ast
import builtins
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
from ..shared import failures

KEY_FILE = "DDP_KIT_SESSION_KEY_FILE"
ADDRESS = "DDP_KIT_SESSION_ADDRESS"


class Channel:
    """The connection to the kernel; sends are locked (output may come from other threads)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.lock = threading.Lock()

    def send(self, message: tuple) -> None:
        with self.lock:
            self.connection.send(message)


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
            self.channel.send(("out", self.stream, text))
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
    host, port = os.environ[ADDRESS].rsplit(":", 1)
    key = Path(os.environ[KEY_FILE]).read_bytes()
    channel = Channel(Client((host, int(port)), family="AF_INET", authkey=key))
    channel.send(("hello", worker.rank(), os.getpid()))
    return channel


def run_cell(name: str, code: str, namespace: dict[str, Any]) -> None:
    """Run `code` in `namespace`, as a notebook cell: a last expression's value is printed."""
    linecache.cache[name] = (len(code), None, code.splitlines(keepends=True), name)
    tree = ast.parse(code, filename=name)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, name, "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), name, "eval"), namespace)
        if value is not None:
            print(repr(value))


def pullable(value: Any) -> Any:
    """A value to send to the kernel: tensors become numpy arrays (on the CPU)."""
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    if isinstance(value, (list, tuple)):
        return type(value)(pullable(v) for v in value)
    if isinstance(value, dict):
        return {k: pullable(v) for k, v in value.items()}
    return value


def serve() -> None:
    """Answer the kernel's messages until it says exit or goes away."""
    preimport()
    channel = connect()
    interrupts = CellInterrupts()
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    sys.stdout = ChannelWriter(channel, "stdout")
    sys.stderr = ChannelWriter(channel, "stderr")
    while True:
        try:
            message = channel.connection.recv()
        except (EOFError, OSError):
            break  # the kernel is gone
        kind = message[0]
        if kind == "exit":
            break
        if kind == "flush":
            worker.flush()
            channel.send(("flushed",))
            continue
        interrupts.running = True
        try:
            if kind == "run":
                run_cell(message[1], message[2], namespace)
                reply: tuple = ("done", None)
            else:  # pull
                reply = ("value", pullable(namespace[message[1]]))
        except BaseException as error:  # noqa: BLE001  the cell's error is the kernel's to show
            if isinstance(error, KeyError) and kind == "pull":
                error = NameError(f"name {message[1]!r} is not defined on this rank")
            start = message[1] if kind == "run" else None
            tb = failures.drop_trailing(error.__traceback__, __file__)  # the SIGINT handler
            failure = failures.describe(worker.rank(), error, tb, start)
            reply = ("done", asdict(failure))
        finally:
            interrupts.running = False
            sys.stdout.flush()
        channel.send(reply)
    _leave(channel)


def _leave(channel: Channel) -> None:
    """Write the records, leave the process group, close the channel."""
    import torch.distributed as dist

    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    worker.flush()
    if dist.is_initialized():
        dist.destroy_process_group()
    channel.connection.close()
