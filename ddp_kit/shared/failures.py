"""Rank failure reports: written by a failing rank, read back by the kernel (both ends here).

A rank that raises (SystemExit with a non-zero code included) writes ``rank<R>.json`` into the
run's error directory; the launcher reads every report into a RankFailure, earliest first. A
rank killed by a fatal signal leaves its stack in ``fault-rank<R>.txt`` (Python's faulthandler);
the kernel turns such an end, and an exit with no Python exception, into a RankFailure of type
PROCESS_ENDED from torchrun's own summary (kernel.diagnose.process_ends).
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import TracebackType

# What a rank's error says when its collective waited for ranks that never came (gloo's timeout)
# or a peer's process went away mid-collective (kernel.diagnose explains them).
HANG_SIGNS = ("Timed out waiting", "timed out", "Connection closed by peer", "Connection reset")
PROCESS_ENDED = "ProcessEnded"  # a rank whose process ended without a Python exception


@dataclass(frozen=True)
class RankFailure:
    """An uncaught exception reported by one rank."""

    rank: int
    type: str
    message: str
    traceback: str
    time: float


def from_exception(
    rank: int, error: BaseException, tb: TracebackType | None, start_file: str | None = None
) -> RankFailure:
    """A RankFailure for `error`; the traceback starts at the frames of `start_file`, if given."""
    shown = from_file(tb, start_file) if start_file else tb
    text = "".join(traceback.format_exception(type(error), error, shown))
    return RankFailure(rank, type(error).__name__, str(error), text, time.time())


def from_file(tb: TracebackType | None, filename: str) -> TracebackType | None:
    """Skip the traceback entries above `filename` (the runner's, runpy's or the server's)."""
    first = tb
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    return tb or first


def drop_trailing(tb: TracebackType | None, filename: str) -> TracebackType | None:
    """Drop the entries in `filename` that come after other code's (a signal handler's)."""
    entry, seen_other = tb, False
    while entry is not None and entry.tb_next is not None:
        seen_other |= entry.tb_frame.f_code.co_filename != filename
        if seen_other and entry.tb_next.tb_frame.f_code.co_filename == filename:
            entry.tb_next = None
            break
        entry = entry.tb_next
    return tb


def report_file(error_dir: str | Path, rank: int) -> Path:
    """Where rank `rank` writes its report of an uncaught exception (write_report)."""
    return Path(error_dir) / f"rank{rank}.json"


def fault_file(error_dir: str | Path, rank: int) -> Path:
    """Where rank `rank`'s faulthandler writes its stack if a fatal signal kills it."""
    return Path(error_dir) / f"fault-rank{rank}.txt"


def earliest(failures: list[RankFailure]) -> RankFailure | None:
    """The failure reported first (the others often follow from it), or None; when every rank
    failed with the same error (type and message), rank 0's or the lowest rank's (each is its
    own, and which came first is chance), unless it is a collective that timed out (then the
    first to time out waited longest)."""
    if not failures:
        return None
    alike = len({(f.type, f.message) for f in failures}) == 1
    hang = any(sign in failures[0].message for sign in HANG_SIGNS)
    if len(failures) > 1 and alike and not hang:
        return min(failures, key=lambda f: f.rank)
    return min(failures, key=lambda f: f.time)


def write_report(error_dir: Path, failure: RankFailure) -> Path:
    """Save `failure` as rank<R>.json in `error_dir`."""
    path = report_file(error_dir, failure.rank)
    path.write_text(json.dumps(asdict(failure)))
    return path


def read_reports(error_dir: Path) -> list[RankFailure]:
    """Every report in `error_dir`, earliest first; an unreadable one is reported as such."""
    names = [f.name for f in fields(RankFailure)]
    failures = []
    for path in sorted(Path(error_dir).glob("rank*.json")):
        try:
            data = json.loads(path.read_text())
            failures.append(RankFailure(**{name: data[name] for name in names}))
        except (ValueError, KeyError, TypeError):
            rank = int(path.stem.removeprefix("rank"))
            failures.append(RankFailure(rank, "UnreadableReport", str(path), "", float("inf")))
    return sorted(failures, key=lambda f: f.time)
