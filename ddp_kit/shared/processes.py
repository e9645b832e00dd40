"""Process-tree housekeeping: no agent or rank outlives the kernel that started it.

Two guards, both armed in every agent and rank: Linux's PR_SET_PDEATHSIG (the kernel signals
the child when its parent exits) and a portable watchdog thread that notices the parent is
gone (macOS has no PDEATHSIG). `stop_tree` ends a whole tree from the kernel's side.

A process forked by the fork server (rank.forkserver) has the server as its parent, and its
relay stands in for it under torchrun: there, the relay takes the parent-death signal (the
child asks it to), and once the relay is gone the server sends the child SIGKILL, as does a
thread in the child (if it can take the GIL).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time

import psutil

from .contract import NO_PDEATHSIG

PR_SET_PDEATHSIG = 1
WATCH_SECONDS = 0.5

_relay_link: socket.socket | None = None  # set in a process forked by the fork server


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Deliver `sig` to this process when its parent exits: PDEATHSIG on Linux, and a watchdog.

    In a forked process, the parent is its relay's: the relay arms the signal for itself and
    passes it on."""
    if _relay_link is not None:
        _relay_link.sendall((json.dumps({"deathsig": int(sig)}) + "\n").encode())
        return
    set_parent_death_signal(sig)
    watch_parent(sig)


def set_parent_death_signal(sig: int) -> None:
    """Linux's PR_SET_PDEATHSIG: the kernel sends `sig` when the parent thread exits."""
    if sys.platform.startswith("linux") and not os.environ.get(NO_PDEATHSIG):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def link_to_relay(link: socket.socket) -> threading.Thread:
    """In a process forked by the fork server: end with SIGKILL once the relay's end of `link`
    closes (the relay died), and send die_with_parent's signal to the relay."""
    global _relay_link
    _relay_link = link

    def watch() -> None:
        try:
            while link.recv(4096):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="ddp_kit-parent-watchdog", daemon=True)
    thread.start()
    return thread


def watch_parent(sig: int, interval: float = WATCH_SECONDS) -> threading.Thread:
    """A daemon thread that sends `sig` to this process once its parent is gone.

    An orphan is re-parented (to init or a subreaper), so a changed parent pid means the
    parent died; this works on every POSIX system.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os.kill(os.getpid(), sig)

    thread = threading.Thread(target=watch, name="ddp_kit-parent-watchdog", daemon=True)
    thread.start()
    return thread


def descendants(pid: int) -> list[psutil.Process]:
    """Every living process below `pid`."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def stop_tree(pid: int, grace: float = 3.0) -> list[int]:
    """SIGTERM `pid` and its descendants, SIGKILL what is left after `grace` seconds.

    Returns the pids that had to be killed. torchrun starts each worker in its own session,
    so a process-group kill would miss them: the tree is walked instead.
    """
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    tree = [root, *descendants(pid)]
    for proc in tree:
        _signal(proc, signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=grace)
    alive += [p for p in descendants(pid) if p not in alive]
    for proc in alive:
        _signal(proc, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=grace)
    return [p.pid for p in alive]


def end_data_loader_workers() -> int:
    """Shut down the worker processes of every DataLoader iterator still alive in this process
    (a rank whose script ends with `persistent_workers=True`, or a half-read iterator); how
    many iterators had workers.

    A rank ends without the interpreter's teardown (rank.runner.end_rank), so the iterators
    are freed by the collector instead, and it clears their queues' weak references (whose
    callbacks close the queues' feeder threads) before their __del__ runs: the workers then
    never get their "stop" and __del__ waits torch's 5 s status interval for each of them
    (10 s for num_workers=2). Shut down here, while everything is reachable, they end at once.
    """
    dataloader = sys.modules.get("torch.utils.data.dataloader")
    iterator_type = getattr(dataloader, "_MultiProcessingDataLoaderIter", None)
    if iterator_type is None:
        return 0
    import gc

    # type(), not isinstance: an object's __class__ may be a property that warns (torch's)
    iterators = [obj for obj in gc.get_objects() if issubclass(type(obj), iterator_type)]
    for iterator in iterators:
        try:
            iterator._shutdown_workers()
        except Exception:  # noqa: BLE001  a half-built iterator: its __del__ copes as before
            pass
    return len(iterators)


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except psutil.NoSuchProcess:
        pass
