"""The markers a rank leaves in the run directory's done/ folder: written by the runner, read by
the launcher (which ranks completed) and by the progress line (which ranks are running)."""

from __future__ import annotations

import os
from pathlib import Path

STARTED = "started-rank"  # bootstrapped, about to run the script
COMPLETED = "rank"  # the script returned and its records are saved


def mark(stage: str, rank: int) -> None:
    """Leave `stage`'s marker for `rank` (nothing outside a launch: no DDP_KIT_DONE_DIR)."""
    done_dir = os.environ.get("DDP_KIT_DONE_DIR")
    if done_dir:
        (Path(done_dir) / f"{stage}{rank}").touch()


def ranks_marked(done_dir: Path, stage: str) -> list[int]:
    """The ranks that left `stage`'s marker in `done_dir`, in order."""
    names = [path.name for path in Path(done_dir).iterdir()]
    ranks = [name[len(stage) :] for name in names if name.startswith(stage)]
    return sorted(int(rank) for rank in ranks if rank.isdigit())
