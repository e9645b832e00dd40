"""Show each rank's output in the notebook, rank-prefixed, and keep all of it per rank.

Modes:
- "ordered" (default): rank 0's stdout appears live; the other ranks' stdout follows when the
  run (or cell) ends, in rank order, then every rank's stderr. The same text every run, so
  nbval can compare it.
- "live": every line as it arrives, ranks interleaved in whatever order they print.
- "quiet": nothing is shown (the text is still kept).

RankPrinter takes text chunks from anywhere (a live rank's channel); RankOutput feeds it from
the log files torchrun writes for a one-shot launch.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

OUTPUT_MODES = ("ordered", "live", "quiet")
STREAMS = ("stdout", "stderr")


class RankPrinter:
    """Cuts each rank's text into lines and shows them as the mode allows."""

    def __init__(
        self,
        ranks: Sequence[int],
        mode: str = "ordered",
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        self.ranks = list(ranks)
        self.mode = mode
        self.out = out
        self.err = err
        self.lines: dict[tuple[int, str], list[str]] = {}
        self.partial: dict[tuple[int, str], str] = {}
        self.shown: dict[tuple[int, str], int] = {}
        for rank in self.ranks:
            for stream in STREAMS:
                self.lines[rank, stream], self.partial[rank, stream] = [], ""
                self.shown[rank, stream] = 0

    def write(self, rank: int, stream: str, text: str) -> None:
        """Take `text` from `rank`; show its complete lines if the mode shows them now."""
        key = (rank, stream)
        *complete, self.partial[key] = (self.partial[key] + text).split("\n")
        self.lines[key] += complete
        if self._live(rank, stream):
            self._show(rank, stream)

    def end_lines(self) -> None:
        """Take the unfinished last lines too (the writers are done)."""
        for key, partial in self.partial.items():
            if partial:
                self.lines[key].append(partial)
                self.partial[key] = ""

    def show_rest(self) -> None:
        """Take the unfinished last lines too, and show everything not shown yet."""
        self.end_lines()
        for stream in STREAMS:
            for rank in self.ranks:
                self._show(rank, stream)

    def text(self, rank: int, stream: str) -> str:
        """Everything `rank` wrote to `stream` ("stdout" or "stderr")."""
        return "".join(line + "\n" for line in self.lines[rank, stream])

    def _live(self, rank: int, stream: str) -> bool:
        return self.mode == "live" or (self.mode == "ordered" and (rank, stream) == (0, "stdout"))

    def _show(self, rank: int, stream: str) -> None:
        key = (rank, stream)
        new = self.lines[key][self.shown[key] :]
        self.shown[key] = len(self.lines[key])
        if self.mode == "quiet" or not new:
            return
        target = (self.out or sys.stdout) if stream == "stdout" else (self.err or sys.stderr)
        target.write("".join(f"[rank {rank}] {line}\n" for line in new))
        target.flush()


class _LogFile:
    """One rank's log file, followed from where the last read stopped."""

    def __init__(self, root: Path, relative: str) -> None:
        self.root, self.relative = Path(root), relative
        self.path: Path | None = None
        self.offset = 0

    def read_new(self) -> str:
        """Text written since the last call ("" if none, or the file does not exist yet)."""
        if self.path is None:
            self.path = _find(self.root, self.relative)
        if self.path is None or self.path.stat().st_size == self.offset:
            return ""
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
            self.offset = fh.tell()
        return chunk


def _find(root: Path, relative: str) -> Path | None:
    """torchrun writes logs under <log-dir>/<run id>/attempt_<n>/<local rank>/."""
    matches = sorted(root.glob(f"*/attempt_*/{relative}"))
    return matches[-1] if matches else None


class RankOutput(RankPrinter):
    """Follows the log files torchrun writes for each rank while a launch goes on."""

    def __init__(
        self,
        log_roots: list[Path],
        nproc_per_node: int,
        mode: str = "ordered",
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        super().__init__(range(len(log_roots) * nproc_per_node), mode, out, err)
        self.files = {
            (node * nproc_per_node + local, stream): _LogFile(root, f"{local}/{stream}.log")
            for node, root in enumerate(log_roots)
            for local in range(nproc_per_node)
            for stream in STREAMS
        }

    def ranks_started(self) -> int:
        """How many ranks torchrun has started: their stdout logs were found by a poll."""
        return sum(log.path is not None for (_, stream), log in self.files.items()
                   if stream == "stdout")  # fmt: skip

    def poll(self) -> None:
        """Read what the ranks wrote since the last poll and show what the mode allows now."""
        for (rank, stream), log in self.files.items():
            chunk = log.read_new()
            if chunk:
                self.write(rank, stream, chunk)

    def read_rest(self) -> None:
        """Read what the logs hold, for good: the ranks are done and the files may go."""
        self.poll()
        self.files = {}
        self.end_lines()

    def show_rest(self) -> None:
        """Read the rest, then show everything not shown yet, in rank order."""
        self.read_rest()
        super().show_rest()
