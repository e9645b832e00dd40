"""Follow each rank's stdout/stderr log files and show them in the notebook, rank-prefixed.

Modes:
- "ordered" (default): rank 0's stdout appears live; the other ranks' stdout follows when the
  run ends, in rank order, then every rank's stderr. The same text every run, so nbval can
  compare it.
- "live": every line as it arrives, ranks interleaved in whatever order they print.
- "quiet": nothing is shown (the text is still in the RunResult).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

OUTPUT_MODES = ("ordered", "live", "quiet")
STREAMS = ("stdout", "stderr")


@dataclass
class _Followed:
    """One log file being followed: its bytes read so far and its unfinished last line."""

    rank: int
    stream: str
    pattern: tuple[Path, str]
    path: Path | None = None
    offset: int = 0
    partial: str = ""
    lines: list[str] = field(default_factory=list)
    shown: int = 0

    def read_new(self) -> list[str]:
        """Complete lines written since the last call."""
        if self.path is None:
            self.path = _find(*self.pattern)
        if self.path is None or self.path.stat().st_size == self.offset:
            return []
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
            self.offset = fh.tell()
        *complete, self.partial = (self.partial + chunk).split("\n")
        self.lines += complete
        return complete

    def close(self) -> list[str]:
        """Whatever is left, the unfinished last line included."""
        new = self.read_new()
        if self.partial:
            self.lines.append(self.partial)
            new.append(self.partial)
            self.partial = ""
        return new


def _find(root: Path, relative: str) -> Path | None:
    """torchrun writes logs under <log-dir>/<run id>/attempt_<n>/<local rank>/."""
    matches = sorted(root.glob(f"*/attempt_*/{relative}"))
    return matches[-1] if matches else None


class RankOutput:
    """Shows the workers' output while a run goes on, and keeps all of it per rank."""

    def __init__(
        self,
        log_roots: list[Path],
        nproc_per_node: int,
        mode: str = "ordered",
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        self.mode = mode
        self.out = out
        self.err = err
        self.files: dict[tuple[int, str], _Followed] = {}
        for node, root in enumerate(log_roots):
            for local in range(nproc_per_node):
                rank = node * nproc_per_node + local
                for stream in STREAMS:
                    pattern = (Path(root), f"{local}/{stream}.log")
                    self.files[rank, stream] = _Followed(rank, stream, pattern)
        self.world_size = len(log_roots) * nproc_per_node

    def poll(self) -> None:
        """Read what the workers wrote since the last poll and show what the mode allows now."""
        for followed in self.files.values():
            self._show_live(followed, followed.read_new())

    def finish(self) -> None:
        """Read the rest and show everything not shown yet, in rank order."""
        for followed in self.files.values():
            self._show_live(followed, followed.close())
        if self.mode != "ordered":
            return
        for stream in STREAMS:
            for rank in range(self.world_size):
                followed = self.files[rank, stream]
                self._emit(followed, followed.lines[followed.shown :])
                followed.shown = len(followed.lines)

    def text(self, rank: int, stream: str) -> str:
        """Everything `rank` wrote to `stream` ("stdout" or "stderr")."""
        return "".join(line + "\n" for line in self.files[rank, stream].lines)

    def _show_live(self, followed: _Followed, lines: list[str]) -> None:
        live = self.mode == "live" or (
            self.mode == "ordered" and followed.rank == 0 and followed.stream == "stdout"
        )
        if live and lines:
            self._emit(followed, lines)
            followed.shown += len(lines)

    def _emit(self, followed: _Followed, lines: list[str]) -> None:
        if self.mode == "quiet" or not lines:
            return
        target = (
            (self.out or sys.stdout) if followed.stream == "stdout" else (self.err or sys.stderr)
        )
        target.write("".join(f"[rank {followed.rank}] {line}\n" for line in lines))
        target.flush()
