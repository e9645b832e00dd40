"""A one-line status while a launch starts (torchrun, rendezvous, `import torch` take 10-15 s
on a laptop before a rank prints anything), updated in place in JupyterLab.

Shown only in a Jupyter kernel, and not with DDP_KIT_PROGRESS=0 (set by the test run and by
./kit refresh, so the outputs nbval compares never hold it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..shared import contract
from ..shared.markers import STARTED, ranks_marked
from .output import RankOutput

UPDATE_SECONDS = 0.5


def wanted() -> bool:
    """Whether this process is a Jupyter kernel that should show progress."""
    if os.environ.get(contract.PROGRESS) == "0":
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class LaunchProgress:
    """Counts ranks started (torchrun created their logs: rendezvous is done) and ranks
    running the script (the runner marked them), and shows it with the elapsed time."""

    def __init__(
        self, output: RankOutput, marker_dir: Path, world_size: int, enabled: bool
    ) -> None:
        self.output = output
        self.marker_dir = Path(marker_dir)
        self.world_size = world_size
        self.start = time.monotonic()
        self.last = 0.0
        self.handle = None
        if enabled:
            from IPython.display import display

            self.handle = display(self._text(), display_id=True)

    def update(self) -> None:
        """Refresh the line (at most every UPDATE_SECONDS)."""
        now = time.monotonic()
        if self.handle is None or now - self.last < UPDATE_SECONDS:
            return
        self.last = now
        self.handle.update(self._text())

    def end(self, summary: str) -> None:
        """Replace the line with a summary of the run."""
        if self.handle is not None:
            self.handle.update(_Line(f"[ddp_kit] {summary}"))

    def _text(self) -> _Line:
        elapsed = time.monotonic() - self.start
        started = self.output.ranks_started()
        running = len(ranks_marked(self.marker_dir, STARTED))
        if not started:
            state = "torchrun is starting (rendezvous on 127.0.0.1)"
        else:
            state = (
                f"rendezvous done; {started}/{self.world_size} ranks started, "
                f"{running}/{self.world_size} running the script (after `import torch`)"
            )
        return _Line(f"[ddp_kit] {state} · {elapsed:.0f} s")


class _Line:
    """Plain text shown as it is (a str would be shown with its quotes)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text
