"""A bound on the waits that torch ends late or never: gloo connecting the ranks (up to 5 times
the timeout), freeing a process group (never), and a backstop for the rendezvous.

A gloo collective that waits past its timeout raises in torch itself. Not every wait does:
when a peer's address is in the store but does not answer, gloo's connectFullMesh, inside
init_process_group or new_group, gives up only at 5 times the timeout (measured on torch 2.13:
collective_timeout=20 -> "Gloo connectFullMesh failed with ... Connect timeout" after 100 s, so
the default 60 s became 300 s, the kit's run and cell limits).

A rank's `Watch` thread reads the main thread's stack (sys._current_frames) twice a second. When
the main thread has been in one of the WAITS below (the innermost one on its stack: each phase
has its own clock) for longer than that wait's timeout plus GRACE, the rank reports a failure
that names the wait, where the code was, and the usual causes. An error that torch raises within
GRACE of its timeout comes first and is kept; where torch is later (the rendezvous's retry
backoff: 27 s at a 20 s timeout), the kit's report of the same wait comes first:

    wait        the main thread is in                       its timeout
    rendezvous  torch/distributed/rendezvous.py             the call's `timeout`, else the
    init        init_process_group, new_group, ...          collective timeout
    teardown    destroy_process_group, groups.release

The report ends the wait: `on_stall` sends it, because a thread stuck inside C++ cannot be
interrupted. Under a launch the rank writes it as its error report and exits, so the run fails;
a live rank answers its cell with it, and the session replaces the ranks.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType

from ..shared.contract import STALLED_WAIT
from ..shared.failures import RankFailure

GRACE = 5.0  # seconds past the timeout, so that torch's own timeout error comes first
POLL = 0.5


@dataclass(frozen=True)
class Wait:
    kind: str
    what: str  # what the rank was waiting for, and the usual causes


RENDEZVOUS = Wait(
    "rendezvous",
    "it was connecting to the rendezvous store at {address}. Nothing answered there: under "
    "torchrun every rank meets at torchrun's MASTER_ADDR and MASTER_PORT; a script that sets "
    "them itself sends the ranks where nobody listens.",
)
INIT = Wait(
    "init",
    "gloo was connecting this rank to the others, and what it waited for did not answer: a "
    "rank that stopped while joining, an address this rank cannot reach (GLOO_SOCKET_IFNAME), "
    "or a store that does not reply. Join the process group once per process, with every "
    "rank.",
)
TEARDOWN = Wait(
    "teardown",
    "it was freeing a process group, whose destructor waits for gloo's threads to finish.",
)
WAITS = {  # (file ending, function or "*") -> the wait
    ("torch/distributed/rendezvous.py", "*"): RENDEZVOUS,
    ("torch/distributed/distributed_c10d.py", "init_process_group"): INIT,
    ("torch/distributed/distributed_c10d.py", "new_group"): INIT,
    ("torch/distributed/distributed_c10d.py", "new_subgroups"): INIT,
    ("torch/distributed/distributed_c10d.py", "split_group"): INIT,
    ("torch/distributed/distributed_c10d.py", "destroy_process_group"): TEARDOWN,
    ("ddp_kit/rank/groups.py", "release"): TEARDOWN,
}


def waiting_in(frame: FrameType | None) -> tuple[Wait, FrameType] | None:
    """The innermost watched wait on this stack, and its frame (None if there is none)."""
    while frame is not None:
        code = frame.f_code
        path = code.co_filename.replace(os.sep, "/")
        for (ending, function), wait in WAITS.items():
            if path.endswith(ending) and function in ("*", code.co_name):
                return wait, frame
        frame = frame.f_back
    return None


def limit(frame: FrameType, default: timedelta) -> float:
    """The wait's own `timeout` argument if it has one, else `default`; plus GRACE."""
    timeout = frame.f_locals.get("timeout")
    if not isinstance(timeout, timedelta):
        timeout = default
    return timeout.total_seconds() + GRACE


def report(rank: int, wait: Wait, frame: FrameType, seconds: float) -> RankFailure:
    """The failure a stalled wait becomes: what waited, for how long, where the code was."""
    address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    call = f"{frame.f_code.co_name}()" if wait.kind != "rendezvous" else "the rendezvous"
    message = (
        f"{wait.kind}: {call} did not return within {seconds:.0f} s (its timeout + {GRACE:g} s), "
        "so ddp_kit ended the wait: " + wait.what.format(address=address)
    )
    text = f"Traceback (most recent call last):\n{user_stack(frame)}{STALLED_WAIT}: {message}\n"
    return RankFailure(rank, STALLED_WAIT, message, text, time.time())


_watch: Watch | None = None


def start(rank: int, timeout: timedelta, on_stall: Callable[[RankFailure], None]) -> None:
    """Watch this process's main thread (once per process)."""
    global _watch
    if _watch is None:
        _watch = Watch(rank, timeout, on_stall)
        _watch.thread.start()


def on_stall(handler: Callable[[RankFailure], None]) -> None:
    """What ends a stalled wait from now on (a live rank answers its cell with it)."""
    if _watch is not None:
        _watch.on_stall = handler


def user_stack(frame: FrameType) -> str:
    """The stack down to `frame`, from the user's first frame: the kit's frames and runpy's
    above the user's code are left out, as in the kit's other tracebacks."""
    entries = traceback.extract_stack(frame)
    kit = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    first = 0
    for i, entry in enumerate(entries):
        if entry.filename.startswith(kit) or entry.filename.startswith("<frozen"):
            first = i + 1
        elif f"{os.sep}torch{os.sep}" in entry.filename:
            break
    return "".join(traceback.format_list(entries[first:]))


class Watch:
    """The thread that watches the main thread's waits; `on_stall(failure)` ends one."""

    def __init__(
        self, rank: int, timeout: timedelta, on_stall: Callable[[RankFailure], None]
    ) -> None:
        self.rank, self.timeout, self.on_stall = rank, timeout, on_stall
        self.main = threading.main_thread().ident
        self.stopped = threading.Event()  # set: the thread ends (after a stall, or by a test)
        self.thread = threading.Thread(target=self._run, name="ddp_kit-wait-watch", daemon=True)

    def _run(self) -> None:
        since: tuple[int, float] | None = None  # (id of the wait's frame, when it was first seen)
        while not self.stopped.wait(POLL):
            since = self._poll(since)

    def _poll(self, since: tuple[int, float] | None) -> tuple[int, float] | None:
        """One look at the main thread. The frames it sees are dropped when it returns: a frame
        kept between looks would keep that wait's locals and, through f_back, its callers' alive
        (the groups a finished destroy_process_group removed, the DDP model of the function
        that called it), and free them later on this thread."""
        found = waiting_in(sys._current_frames().get(self.main))
        if found is None:
            return None
        wait, frame = found
        if since is None or since[0] != id(frame):
            return (id(frame), time.monotonic())
        waited = time.monotonic() - since[1]
        if waited > limit(frame, self.timeout):
            self.on_stall(report(self.rank, wait, frame, waited))
            self.stopped.set()
        return since
