"""Turn a failed run into a message a student can act on."""

from __future__ import annotations

from .result import RunResult

HANG_SIGNS = ("Timed out waiting", "timed out", "Connection closed by peer", "Connection reset")

HANG_HELP = (
    "A collective (all_reduce, barrier, DDP's gradient sync...) waited for ranks that never "
    "joined it. Usual causes: a collective inside `if rank == 0:`, ranks with different numbers "
    "of batches, or another rank that crashed. Every rank must call the same collectives in the "
    "same order. If the job is only slow, raise collective_timeout=."
)


def explain(result: RunResult, timeout: float) -> str:
    """A message naming what failed, where, and what to do."""
    if result.interrupted:
        return f"The run was interrupted; all {result.world_size} worker processes were stopped."
    if result.timed_out:
        return (
            f"The run passed its time limit of {timeout:g} s and was stopped; all "
            f"{result.world_size} worker processes were ended. If the job is just slow, raise "
            "timeout=. If it hangs: " + HANG_HELP + _stderr_tails(result)
        )
    root = result.root_cause
    if root is None:
        return (
            f"torchrun exited with code {result.returncode}, but no rank raised a Python "
            "exception (a rank may have called sys.exit/os._exit, or crashed)."
            + _stderr_tails(result)
        )
    others = sorted({f.rank for f in result.failures} - {root.rank})
    message = f"Rank {root.rank} failed with {root.type}: {root.message}"
    if any(sign in root.message for sign in HANG_SIGNS):
        message += "\n\n" + HANG_HELP
    if others:
        message += f"\n\n(Rank(s) {', '.join(map(str, others))} failed after it, as a consequence.)"
    return f"{message}\n\nTraceback of rank {root.rank}:\n{root.traceback}"


def _stderr_tails(result: RunResult, lines: int = 5) -> str:
    parts = []
    for rank, text in enumerate(result.stderr):
        tail = [line for line in text.splitlines() if line.strip()][-lines:]
        if tail:
            parts.append(f"\n--- last stderr lines of rank {rank} ---\n" + "\n".join(tail))
    return "".join(parts)
