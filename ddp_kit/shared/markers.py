"""A rank's markers in the run directory's markers/ folder (shared.contract names them): the
runner writes them, the kernel reads which ranks completed and the status line which started."""

from __future__ import annotations

import os
from pathlib import Path

from .contract import COMPLETED, MARKER_DIR, STARTED

__all__ = ["COMPLETED", "STARTED", "mark", "ranks_marked"]


def mark(stage: str, rank: int) -> None:
    """Leave `stage`'s marker for `rank` (nothing outside a launch: no DDP_KIT_MARKER_DIR)."""
    marker_dir = os.environ.get(MARKER_DIR)
    if marker_dir:
        (Path(marker_dir) / f"{stage}{rank}").touch()


def ranks_marked(marker_dir: Path, stage: str) -> list[int]:
    """The ranks that left `stage`'s marker in `marker_dir`, in order."""
    names = [path.name for path in Path(marker_dir).iterdir()]
    ranks = [name[len(stage) :] for name in names if name.startswith(stage)]
    return sorted(int(rank) for rank in ranks if rank.isdigit())
