"""Shared fixtures: every test must leave no torchrun agent or worker process behind."""

from __future__ import annotations

import time

import psutil
import pytest

KIT_PROCESSES = ("ddp_kit.agent", "ddp_kit.runner")

# Code that makes a child Python process stand in for a notebook kernel: like ipykernel while a
# cell runs, SIGINT raises KeyboardInterrupt, even if this test run was started with SIGINT
# ignored (a shell's background job: its children then inherit SIG_IGN).
KERNEL_SIGINT = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"


def kit_processes() -> list[psutil.Process]:
    """Every living torchrun agent or worker started by ddp_kit on this machine, orphans too."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(k in cmdline for k in KIT_PROCESSES):
            found.append(proc)
    return found


def wait_until_gone(seconds: float = 5.0) -> list[str]:
    """Wait up to `seconds` for kit processes to end; describe those still there."""
    deadline = time.monotonic() + seconds
    while kit_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    return [f"{p.pid} {' '.join(p.cmdline()[:6])}" for p in kit_processes()]


@pytest.fixture(autouse=True)
def no_orphan_processes(request):
    """Fail a test that leaves any agent or worker running (checked machine-wide).

    Tests using a module-wide live session (fixture `live`) are checked when it closes."""
    yield
    if "live" in request.fixturenames:
        return
    left = wait_until_gone()
    assert not left, f"processes left running: {left}"
