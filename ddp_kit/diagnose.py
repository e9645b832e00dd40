"""Turn a failed run or cell into a message a student can act on."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .failures import RankFailure
from .result import RunResult

HANG_SIGNS = ("Timed out waiting", "timed out", "Connection closed by peer", "Connection reset")

SOURCE_TAG = re.compile(r"\[/\S+:\d+\] ")  # gloo's "[/path/to/file.cc:78] " prefix

HANG_HELP = (
    "A collective (all_reduce, barrier, DDP's gradient sync...) waited for ranks that never "
    "joined it. Usual causes: a collective inside `if rank == 0:`, ranks with different numbers "
    "of batches, or another rank that crashed. Every rank must call the same collectives in the "
    "same order. If the job is only slow, raise collective_timeout=."
)


@dataclass(frozen=True)
class Explanation:
    """What failed (summary), what to do (advice) and the failing rank's traceback."""

    summary: str
    advice: str = ""
    traceback: str = ""
    rank: int | None = None

    @property
    def message(self) -> str:
        """Everything, as one text: the error's str()."""
        parts = [self.summary, self.advice]
        if self.traceback:
            parts.append(f"Traceback of rank {self.rank}:\n{self.traceback}")
        return "\n\n".join(p for p in parts if p)

    def rendered(self, kind: str) -> list[str]:
        """What a notebook shows: the rank's traceback (cell line numbers) ends with its
        error, so the summary is not repeated above it, and no frame of the kit is shown."""
        if not self.traceback:
            return [f"{kind}: {self.message}"]
        head = f"{kind}: rank {self.rank} failed; its traceback (your code's line numbers):"
        lines = [head, "", self.traceback.rstrip("\n")]
        return lines + (["", self.advice] if self.advice else [])


def explain_failures(failures: Sequence[RankFailure], together: bool = False) -> Explanation:
    """The earliest failure, with advice for hangs and the other ranks that failed.

    In a launch the others failed after it, as a consequence (torchrun stops them); in a live
    cell (`together`) each rank ran the cell on its own, so they failed too.
    """
    root = min(failures, key=lambda f: f.time)
    others = sorted({f.rank for f in failures} - {root.rank})
    advice = []
    if any(sign in root.message for sign in HANG_SIGNS):
        advice.append(HANG_HELP)
    if others and together:
        kinds = sorted({f.type for f in failures if f.rank != root.rank})
        advice.append(f"(Rank(s) {', '.join(map(str, others))} failed too: {', '.join(kinds)}.)")
    elif others:
        advice.append(f"(Rank(s) {', '.join(map(str, others))} failed after it, as a consequence.)")
    return Explanation(
        f"Rank {root.rank} failed with {root.type}: {SOURCE_TAG.sub('', root.message)}",
        "\n\n".join(advice),
        root.traceback,
        root.rank,
    )


def explain(result: RunResult, timeout: float) -> Explanation:
    """What failed in a launch, where, and what to do."""
    if result.interrupted:
        return Explanation(
            f"The run was interrupted; all {result.world_size} worker processes were stopped."
        )
    if result.timed_out:
        return Explanation(
            f"The run passed its time limit of {timeout:g} s and was stopped; all "
            f"{result.world_size} worker processes were ended. If the job is just slow, raise "
            "timeout=. If it hangs: " + HANG_HELP + stderr_tails(result.stderr)
        )
    if not result.failures:
        return Explanation(
            f"torchrun exited with code {result.returncode}, but no rank raised a Python "
            "exception (a rank may have called sys.exit/os._exit, or crashed)."
            + stderr_tails(result.stderr)
        )
    return explain_failures(result.failures)


def teardown_note(result: RunResult) -> str | None:
    """A note for a run whose every script completed but whose exit code says a rank crashed
    as its process ended: the work and records are complete, and the crash is said."""
    if result.returncode == 0 or not result.all_completed or result.failures:
        return None
    return (
        f"torchrun exited with code {result.returncode}, but only after every rank's script "
        "had completed and saved its records: a rank crashed while its process was ending. "
        "The results are complete." + stderr_tails(result.stderr, lines=1)
    )


def stderr_tails(stderr: Sequence[str], lines: int = 5) -> str:
    """The last few non-empty stderr lines of every rank that wrote any."""
    parts = []
    for rank, text in enumerate(stderr):
        tail = [line for line in text.splitlines() if line.strip()][-lines:]
        if tail:
            parts.append(f"\n--- last stderr lines of rank {rank} ---\n" + "\n".join(tail))
    return "".join(parts)
