"""What a launch returns (RunResult) and what a live cell returns (CellResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..shared.failures import RankFailure, earliest
from ..shared.records import Records


@dataclass
class Attempt:
    """One attempt of the whole job: torchrun starts every rank again after one failed, up to
    max_restarts times. Its ranks' TORCHELASTIC_RESTART_COUNT is `number` (0 first)."""

    number: int
    failures: list[RankFailure] = field(default_factory=list)  # what its ranks reported
    error_files: dict[int, dict] = field(default_factory=dict)  # rank -> what @record wrote


@dataclass
class RunResult:
    """Everything one torchrun launch produced. ``records["name"]`` is indexed [step, rank, ...]."""

    nproc: int
    nnodes: int
    backend: str
    device: str
    returncode: int
    duration: float
    stdout: list[str]
    stderr: list[str]
    records: Records
    failures: list[RankFailure] = field(default_factory=list)
    timed_out: bool = False
    interrupted: bool = False
    script: str = ""
    agent_log: str = ""
    commands: list[list[str]] = field(default_factory=list)
    run_dir: Path | None = None
    completed: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)  # the last one's failures: failures
    max_restarts: int = 0  # how many restarts launch() allowed torchrun
    hosts: list[str] = field(default_factory=list)  # each rank's host (launches over hosts)

    @property
    def world_size(self) -> int:
        """Total number of ranks (processes per node x nodes)."""
        return self.nproc * self.nnodes

    @property
    def restarts(self) -> int:
        """How many times torchrun restarted every rank (launch's max_restarts)."""
        return max(len(self.attempts) - 1, 0)

    @property
    def all_completed(self) -> bool:
        """Whether every rank's script returned and its records were saved."""
        return len(self.completed) == self.world_size

    @property
    def ok(self) -> bool:
        """True when every rank finished without error within the time limit (a rank that
        crashed only while its process ended, after its script completed, is a note)."""
        ended_well = self.returncode == 0 or self.all_completed
        return ended_well and not self.failures and not self.timed_out

    @property
    def root_cause(self) -> RankFailure | None:
        """The first failure reported (the others usually follow from it)."""
        return earliest(self.failures)

    def __repr__(self) -> str:
        status = "ok" if self.ok else f"FAILED (exit code {self.returncode})"
        names = ", ".join(self.records.names) or "none"
        return (
            f"<RunResult {status}: {self.world_size} ranks, {self.backend} on {self.device}, "
            f"records: {names}>"
        )


@dataclass
class CellResult:
    """What one cell did on the live ranks. stdout/stderr are indexed by rank."""

    ranks: list[int]
    stdout: list[str]
    stderr: list[str]
    failures: list[RankFailure] = field(default_factory=list)
    duration: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no rank raised."""
        return not self.failures

    @property
    def root_cause(self) -> RankFailure | None:
        """The first failure reported."""
        return earliest(self.failures)

    def __repr__(self) -> str:
        status = "ok" if self.ok else f"FAILED on ranks {sorted(f.rank for f in self.failures)}"
        return f"<CellResult {status}: ranks {self.ranks}, {self.duration:.3f} s>"
