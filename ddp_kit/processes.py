"""Process-tree housekeeping: stop a torchrun agent and every worker, leaving no orphans."""

from __future__ import annotations

import ctypes
import signal
import sys

import psutil

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux only: deliver `sig` to this process when its parent exits."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


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


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except psutil.NoSuchProcess:
        pass
