"""Every test must leave no process of the kit behind (this run's own: tests/support.py)."""

from __future__ import annotations

import pytest
from support import wait_until_gone


@pytest.fixture(autouse=True)
def no_orphan_processes(request):
    """Fail a test that leaves any agent or rank of this run running.

    Tests using a module-wide live session (fixture `live`) are checked when it closes."""
    yield
    if "live" in request.fixturenames:
        return
    left = wait_until_gone()
    assert not left, f"processes left running: {left}"
