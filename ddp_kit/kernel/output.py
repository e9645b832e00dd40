"""Show each rank's output in the notebook, rank-prefixed, and keep all of it per rank.

Modes (OUTPUT_MODES; the flag help of %%torchrun and %ranks start is read from it):
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from ..shared.errors import LaunchConfigError

OUTPUT_MODES = {
    "collapsed": "a line that every rank printed at the same place is shown once, as "
    "[ranks 0-3], the rest per rank; shown as soon as every rank has printed it",
    "all": "every rank's lines: rank 0's as they come, the others' in rank order at the end",
    "rank0": "rank 0's lines only, as they come (the others' are kept in the result)",
    "live": "every line as it arrives, ranks interleaved in whatever order they print",
    "quiet": "nothing (the text is still kept in the result)",
}
STREAMS = ("stdout", "stderr")
__doc__ += "".join(f"- {mode}: {meaning}.\n" for mode, meaning in OUTPUT_MODES.items())
__doc__ += """
Every mode but "live" shows the same text every run, so nbval can compare it: stdout first,
then stderr. RankPrinter takes text chunks from anywhere (a live rank's channel); RankOutput
feeds it from the log files torchrun writes for a one-shot launch.
"""


def span(ranks: Sequence[int]) -> str:
    """ "rank 2", "ranks 1-3", "ranks 0, 2": ranks as a student reads them."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def validate_output(output: str) -> None:
    """Refuse an unknown output mode, naming the ones there are."""
    if output not in OUTPUT_MODES:
        raise LaunchConfigError(f"output={output!r}: use one of {', '.join(OUTPUT_MODES)}.")


# A status line (kernel.progress) drawn on a terminal's stderr, without its newline yet: the
# ranks' lines first wipe it (the status line redraws itself at its next update).
_terminal_status = {"drawn": False}


def terminal_status_drawn() -> None:
    """Say that a status line is on the terminal now, without its newline."""
    _terminal_status["drawn"] = True


def clear_terminal_status() -> None:
    """Wipe a status line drawn on the terminal, so that a line of output starts clean."""
    if _terminal_status["drawn"]:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()
        _terminal_status["drawn"] = False


class RankPrinter:
    """Cuts each rank's text into lines and shows them as the mode allows."""

    def __init__(
        self,
        ranks: Sequence[int],
        mode: str = "collapsed",
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
        self.collapse = {stream: Collapse(self.ranks) for stream in STREAMS}
        for rank in self.ranks:
            for stream in STREAMS:
                self.lines[rank, stream], self.partial[rank, stream] = [], ""
                self.shown[rank, stream] = 0

    def write(self, rank: int, stream: str, text: str) -> None:
        """Take `text` from `rank`; show its complete lines if the mode shows them now."""
        key = (rank, stream)
        *complete, self.partial[key] = (self.partial[key] + text).split("\n")
        self.lines[key] += complete
        if self.mode == "collapsed" and stream == "stdout" and complete:
            self._emit(stream, self.collapse[stream].ready(self._columns(stream)))
        elif self._live(rank, stream):
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
            if self.mode == "collapsed":
                self._emit(stream, self.collapse[stream].rest(self._columns(stream)))
                continue
            for rank in self.ranks:
                if self.mode != "rank0" or rank == 0:
                    self._show(rank, stream)

    def text(self, rank: int, stream: str) -> str:
        """Everything `rank` wrote to `stream` ("stdout" or "stderr")."""
        return "".join(line + "\n" for line in self.lines[rank, stream])

    def _columns(self, stream: str) -> dict[int, list[str]]:
        return {rank: self.lines[rank, stream] for rank in self.ranks}

    def _live(self, rank: int, stream: str) -> bool:
        first = (rank, stream) == (0, "stdout")
        return self.mode == "live" or (self.mode in ("all", "rank0") and first)

    def _show(self, rank: int, stream: str) -> None:
        key = (rank, stream)
        new = self.lines[key][self.shown[key] :]
        self.shown[key] = len(self.lines[key])
        self._emit(stream, [f"[rank {rank}] {line}" for line in new])

    def _emit(self, stream: str, lines: list[str]) -> None:
        if self.mode == "quiet" or not lines:
            return
        clear_terminal_status()
        target = (self.out or sys.stdout) if stream == "stdout" else (self.err or sys.stderr)
        target.write("".join(line + "\n" for line in lines))
        target.flush()


class Collapse:
    """The "collapsed" view of one stream, by position: where every rank printed the same line
    at the same place it is shown once (`[ranks 0-3] line`); a stretch where they differ is
    shown rank by rank, ranks with the same stretch together (`[ranks 1, 3] ...`). A stretch
    is shown once every rank has printed the agreeing line after it (or at the end), so what is
    shown, and where it is cut, does not depend on when the ranks printed."""

    def __init__(self, ranks: Sequence[int]) -> None:
        self.ranks = list(ranks)
        self.shown = 0  # lines before this place are shown
        self.scanned = 0  # places before this one are known to agree or differ

    def ready(self, columns: dict[int, list[str]]) -> list[str]:
        """The lines that can be shown now (every rank has printed past them)."""
        common = min(len(lines) for lines in columns.values())
        out: list[str] = []
        for place in range(self.scanned, common):
            row = {columns[rank][place] for rank in self.ranks}
            if len(row) == 1:  # every rank printed this line here
                out += self._stretch(columns, place)
                out.append(f"[{span(self.ranks)}] {row.pop()}")
                self.shown = place + 1
        self.scanned = max(self.scanned, common)
        return out

    def rest(self, columns: dict[int, list[str]]) -> list[str]:
        """Everything not shown yet (the ranks are done)."""
        out = self.ready(columns)
        end = max(len(lines) for lines in columns.values())
        out += self._stretch(columns, end)
        self.shown = self.scanned = end
        return out

    def _stretch(self, columns: dict[int, list[str]], end: int) -> list[str]:
        """The lines from `self.shown` to `end`, rank by rank; equal stretches together."""
        groups: dict[tuple[str, ...], list[int]] = {}
        for rank in self.ranks:
            lines = tuple(columns[rank][self.shown : end])
            if lines:
                groups.setdefault(lines, []).append(rank)
        return [f"[{span(ranks)}] {line}" for lines, ranks in groups.items() for line in lines]


class _LogFile:
    """One rank's log file of one attempt, followed from where the last read stopped."""

    def __init__(self, root: Path, relative: str) -> None:
        self.root, self.relative = Path(root), relative
        self.attempt = 0
        self.path: Path | None = None
        self.offset = 0

    def read_new(self) -> str:
        """Text written since the last call ("" if none, or the file does not exist yet)."""
        if self.path is None:
            self.path = _find(self.root, f"attempt_{self.attempt}/{self.relative}")
        if self.path is None or self.path.stat().st_size == self.offset:
            return ""
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
            self.offset = fh.tell()
        return chunk

    def next_attempt(self) -> None:
        """Follow the next attempt's file from its start (torchrun restarted the ranks)."""
        self.attempt += 1
        self.path, self.offset = None, 0


def _find(root: Path, relative: str) -> Path | None:
    """torchrun writes logs under <log-dir>/<run id>/attempt_<n>/<local rank>/."""
    matches = sorted(root.glob(f"*/{relative}"))
    return matches[-1] if matches else None


def restart_line(attempt: int) -> str:
    """The line each rank's output gets where torchrun restarted it (--max-restarts): the
    attempt is the ranks' TORCHELASTIC_RESTART_COUNT."""
    return f"-- torchrun restarted every rank: attempt {attempt} --\n"


class RankOutput(RankPrinter):
    """Follows the log files torchrun writes for each rank while a launch goes on."""

    def __init__(
        self,
        log_roots: list[Path],
        nproc_per_node: int,
        mode: str = "collapsed",
        out: TextIO | None = None,
        err: TextIO | None = None,
        max_restarts: int = 0,
        groups: Callable[[], dict[int, int]] | None = None,
    ) -> None:
        """groups: for a launch over several hosts, which torchrun node (group) rank each
        host's agent got, as far as known yet (a host's files are read once it is); None: the
        node index is the group rank."""
        super().__init__(range(len(log_roots) * nproc_per_node), mode, out, err)
        self.max_restarts = max_restarts
        self.log_roots = [Path(root) for root in log_roots]
        self.nproc_per_node = nproc_per_node
        self.groups = groups
        self.nodes: dict[int, tuple[Path, dict]] = {}  # node: its log root, its ranks' files
        self.files: dict[tuple[int, str], _LogFile] = {}
        self._place_nodes()

    def _place_nodes(self) -> None:
        """Follow the files of every node whose group rank is known (and not yet followed)."""
        known = self.groups() if self.groups else {n: n for n in range(len(self.log_roots))}
        for node, group in known.items():
            if node in self.nodes or node >= len(self.log_roots):
                continue
            root = self.log_roots[node]
            self.nodes[node] = (root, {  # (rank, stream) -> file
                (group * self.nproc_per_node + local, stream):
                    _LogFile(root, f"{local}/{stream}.log")
                for local in range(self.nproc_per_node)
                for stream in STREAMS
            })  # fmt: skip
            self.files.update(self.nodes[node][1])

    def ranks_started(self) -> int:
        """How many ranks torchrun has started: their stdout logs were found by a poll."""
        return sum(log.path is not None for (_, stream), log in self.files.items()
                   if stream == "stdout")  # fmt: skip

    def poll(self) -> None:
        """Read what the ranks wrote since the last poll and show what the mode allows now;
        where torchrun restarted a node's ranks, read their last attempt's lines to the end,
        then a line that says so, then the next attempt's."""
        if self.groups and len(self.nodes) < len(self.log_roots):
            self._place_nodes()
        self._read_files(self.files)
        for root, logs in self.nodes.values():
            attempt = next(iter(logs.values())).attempt  # the same for all of a node's files
            while attempt < self.max_restarts and _find(root, f"attempt_{attempt + 1}"):
                self._read_files(logs)
                for (rank, stream), log in logs.items():
                    printed = log.offset > 0
                    log.next_attempt()
                    if stream == "stdout" or printed:  # stderr: where it had lines before
                        self.write(rank, stream, restart_line(log.attempt))
                self._read_files(logs)
                attempt += 1

    def _read_files(self, files: dict) -> None:
        for (rank, stream), log in files.items():
            chunk = log.read_new()
            if chunk:
                self.write(rank, stream, chunk)

    def read_rest(self) -> None:
        """Read what the logs hold, for good: the ranks are done and the files may go."""
        self.poll()
        self.files, self.nodes, self.groups = {}, {}, None
        self.end_lines()

    def show_rest(self) -> None:
        """Read the rest, then show everything not shown yet, in rank order."""
        self.read_rest()
        super().show_rest()
