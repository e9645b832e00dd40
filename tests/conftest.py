"""Shared fixtures: every test must leave no torchrun or worker process behind."""

from __future__ import annotations

import time

import psutil
import pytest


def live_children() -> list[psutil.Process]:
    """This test process's living descendants (zombies already reaped excluded)."""
    procs = psutil.Process().children(recursive=True)
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(autouse=True)
def no_orphan_processes():
    """Fail a test that leaves any child process running."""
    yield
    deadline = time.monotonic() + 5
    while live_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [f"{p.pid} {' '.join(p.cmdline()[:4])}" for p in live_children()]
    assert not left, f"processes left running: {left}"
