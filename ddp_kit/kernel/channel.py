"""The kernel's end of a live session's wire: one authenticated connection per rank, messages
sent, and replies collected while the ranks' output streams in. (The messages, both ways, are
shared.contract's table.)

The listening socket is on 127.0.0.1 only, with a random key per session; a connection that
does not know the key fails authentication and is dropped before anything is read, and the
kernel stops listening once every rank has said hello.

Collecting replies never raises for the ranks' sake: what stopped it comes back as a Stop
value (the cell passed its time limit, the kernel was interrupted, a rank's process ended),
and the session decides what that means.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener, wait
from pathlib import Path

from ..shared.contract import Busy, Hello, Output, RunCell, send_at_once
from .output import span

HELLO_TIMEOUT = 10.0
INTERRUPT_GRACE = 5.0  # how long interrupted ranks have to answer
POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Stop:
    """Why collecting replies stopped early.

    kind: "timeout" (the cell passed its limit), "interrupt" (the kernel was interrupted) or
    "lost" (a rank's process ended). `interrupted`: the busy ranks that were sent SIGINT;
    `stuck`: those of them that did not answer within INTERRUPT_GRACE; `lost`: the rank whose
    connection closed.
    """

    kind: str
    reason: str
    interrupted: list[int] = field(default_factory=list)
    stuck: list[int] = field(default_factory=list)
    lost: int | None = None


class Channel:
    """Connections to every rank of one session, and the key that authenticates them."""

    def __init__(self) -> None:
        self.key = secrets.token_bytes(32)
        self.conns: dict[int, Connection] = {}
        self.pids: dict[int, int] = {}
        # The latest collect's ranks that have not replied, and where each busy one said it was
        # (readable from another thread while a cell runs: Session.where()).
        self.targets: list[int] = []
        self.running: set[int] = set()
        self.busy: dict[int, Busy] = {}
        self.cell = ""  # the name of the cell sent last
        # How busy ranks get SIGINT: by their pids on this machine, unless the session's ranks
        # run on other hosts (Session sets it: over ssh or srun)
        self.interrupt: Callable[[list[int]], None] = self._interrupt_here

    def write_key(self, path: Path) -> Path:
        """Write the key where the ranks read it (mode 0600, in the private run directory)."""
        path.touch(mode=0o600)
        path.write_bytes(self.key)
        return path

    def listen(self, address: str = "127.0.0.1") -> Listener:
        """A listener on `address` (127.0.0.1; under SLURM, the kernel's address toward the
        nodes), on a free port, that checks the key."""
        return Listener((address, 0), family="AF_INET", authkey=self.key, backlog=64)

    def accept(
        self,
        listener: Listener,
        world: int,
        alive: Callable[[], bool],
        timeout: float,
        on_poll: Callable[[int], None] = lambda connected: None,
    ) -> int:
        """Accept ranks until all `world` said hello, `alive()` turns false or time is up;
        how many connected. `on_poll(connected so far)` is called every POLL_SECONDS."""
        accepted = accept_ranks(listener, world, alive, timeout, on_poll)
        self.conns = {rank: conn for rank, (conn, _) in accepted.items()}
        self.pids = {rank: pid for rank, (_, pid) in accepted.items()}
        return len(accepted)

    def send(self, ranks: Iterable[int], message: tuple) -> None:
        if isinstance(message, RunCell):
            self.cell = message.name
        for rank in ranks:
            self.conns[rank].send(message)

    def collect(
        self,
        ranks: list[int],
        on_output: Callable[[int, str, str], None],
        timeout: float,
        on_poll: Callable[[], None] = lambda: None,
    ) -> tuple[dict[int, tuple], Stop | None]:
        """Each rank's reply, passing output on as it comes (and calling `on_poll` every
        POLL_SECONDS). At the time limit or an interrupt, the ranks still busy get SIGINT and
        INTERRUPT_GRACE seconds to answer."""
        pending = {self.conns[rank]: rank for rank in ranks}
        replies: dict[int, tuple] = {}
        self.targets, self.running, self.busy = list(ranks), set(ranks), {}
        deadline = time.monotonic() + timeout
        try:
            while pending:
                on_poll()
                lost = self._receive(pending, replies, on_output)
                if lost is not None:
                    return replies, Stop("lost", f"Rank {lost}'s process ended", lost=lost)
                if time.monotonic() > deadline:
                    return replies, self._interrupt_busy(
                        "timeout", f"The cell passed its cell_timeout of {timeout:g} s",
                        pending, replies, on_output)  # fmt: skip
        except KeyboardInterrupt:
            return replies, self._interrupt_busy(
                "interrupt", "The cell was interrupted", pending, replies, on_output
            )
        return replies, None

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns, self.pids = {}, {}

    def _interrupt_busy(
        self,
        kind: str,
        reason: str,
        pending: dict[Connection, int],
        replies: dict[int, tuple],
        on_output: Callable[[int, str, str], None],
    ) -> Stop:
        busy = sorted(pending.values())
        try:
            self.interrupt(busy)
        except KeyboardInterrupt:  # a second stop while the hosts are told (most, or all, were)
            pass
        grace = time.monotonic() + INTERRUPT_GRACE
        try:
            while pending and time.monotonic() < grace:
                if self._receive(pending, replies, on_output) is not None:
                    break
        except KeyboardInterrupt:
            pass
        reason += f"; {span(busy)} {'was' if len(busy) == 1 else 'were'} interrupted."
        return Stop(kind, reason, interrupted=busy, stuck=sorted(pending.values()))

    def _interrupt_here(self, ranks: list[int]) -> None:
        for rank in ranks:
            _interrupt(self.pids[rank])

    def _receive(
        self,
        pending: dict[Connection, int],
        replies: dict[int, tuple],
        on_output: Callable[[int, str, str], None],
    ) -> int | None:
        """Take what the pending ranks sent within POLL_SECONDS; a rank whose connection
        closed is returned (its process ended)."""
        for conn in wait(list(pending), POLL_SECONDS):
            rank = pending[conn]
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return rank
            if isinstance(message, Output):
                on_output(rank, message.stream, message.text)
            elif isinstance(message, Busy):
                if rank in self.running and message.cell == self.cell:  # not a late one
                    self.busy[rank] = message
            else:
                replies[rank] = message
                del pending[conn]
                self.running.discard(rank)
        return None


def _interrupt(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGINT)  # a KeyboardInterrupt inside the cell
    except ProcessLookupError:
        pass


def accept_ranks(
    listener: Listener,
    world: int,
    alive: Callable[[], bool],
    timeout: float,
    on_poll: Callable[[int], None] = lambda connected: None,
) -> dict[int, tuple[Connection, int]]:
    """Accept authenticated connections until every rank said hello, `alive()` is false, or
    the time is up. A connection without the key fails authentication and is dropped unread."""
    accepted: dict[int, tuple[Connection, int]] = {}
    done = threading.Event()

    def accept() -> None:
        while len(accepted) < world and not done.is_set():
            try:
                conn = listener.accept()  # the key is checked both ways here
            except Exception:  # AuthenticationError (a stranger), or the wake-up connection
                continue
            try:
                if done.is_set() or not conn.poll(HELLO_TIMEOUT):
                    raise EOFError
                hello = conn.recv()
            except Exception:
                conn.close()
                continue
            if isinstance(hello, Hello) and 0 <= hello.rank < world:
                accepted[hello.rank] = (send_at_once(conn), hello.pid)
            else:
                conn.close()

    thread = threading.Thread(target=accept, name="ddp_kit-accept", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while thread.is_alive() and alive() and time.monotonic() < deadline:
            on_poll(len(accepted))
            thread.join(POLL_SECONDS)
    finally:
        if thread.is_alive():
            done.set()
            _wake(listener.address)
            thread.join(2)
    return accepted


def _wake(address: tuple[str, int]) -> None:
    """Unblock the accepting thread with a connection that will fail authentication."""
    try:
        with socket.create_connection(address, timeout=1):
            pass
    except OSError:
        pass
