"""A rank's markers in the run directory's markers/ folder (shared.contract names them): the
runner writes them, the kernel reads which ranks completed and the status line which started."""

from __future__ import annotations

import os
from pathlib import Path

from .contract import COMPLETED, MARKER_DIR, NODE, STARTED

__all__ = ["COMPLETED", "STARTED", "mark", "node_groups", "ranks_marked"]


def mark(stage: str, rank: int) -> None:
    """Leave `stage`'s marker for `rank` (nothing outside a launch: no DDP_KIT_MARKER_DIR),
    holding the rank's host index (DDP_KIT_NODE) in a launch over several hosts."""
    marker_dir = os.environ.get(MARKER_DIR)
    if marker_dir:  # written whole, then named: a reader never sees it half written
        path = Path(marker_dir) / f"{stage}{rank}"
        part = path.with_name(f".{path.name}.{os.getpid()}")
        part.write_text(os.environ.get(NODE, ""))
        os.replace(part, path)


def node_groups(marker_dir: Path, nproc: int) -> dict[int, int]:
    """Host index -> torchrun's node (group) rank, from the started markers of a launch over
    several hosts: the c10d rendezvous numbers the nodes in an order of its own."""
    groups = {}
    for rank in ranks_marked(marker_dir, STARTED):
        node = (Path(marker_dir) / f"{STARTED}{rank}").read_text()
        if node.isdigit():
            groups[int(node)] = rank // nproc
    return groups


def ranks_marked(marker_dir: Path, stage: str) -> list[int]:
    """The ranks that left `stage`'s marker in `marker_dir`, in order."""
    names = [path.name for path in Path(marker_dir).iterdir()]
    ranks = [name[len(stage) :] for name in names if name.startswith(stage)]
    return sorted(int(rank) for rank in ranks if rank.isdigit())
