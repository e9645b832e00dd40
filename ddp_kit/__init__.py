"""ddp_kit: watch PyTorch DistributedDataParallel work, step by step, on real torchrun runs.

Two process worlds, and the modules that live in each:

Runs in the notebook kernel
    launcher   launch(): one-shot torchrun job (%%torchrun)     session   live ranks (%%ranks)
    output     rank-prefixed output, ordered or live            records   reading Records
    result     RunResult                                        diagnose  failures -> messages
    magic      %%torchrun and %ranks                            plots     figures of records
    widgets    StepExplorer                                     exercises check functions
    reference  the single-process run DDP must match         progress  a launch's status line
Runs inside each rank (imported by the student's code)
    worker     rank(), backend(), device(), record()            observe   DDP comm-hook recorder
    scratch    data parallelism by hand                         toy       the lessons' data, model
Process entry points
    agent      torchrun that dies with the kernel               runner    a rank's bootstrap
    rank_server  a live rank's loop: receive a cell, run it, answer
Shared by both worlds
    errors     the exceptions                                   records   the records format
    failures   the rank failure report format                  processes no orphan processes
    markers    a rank's started/completed markers
"""

from .kernel.backend import BackendChoice, choose_backend
from .kernel.result import RunResult
from .kernel.session import CellResult, Session
from .kernel.torchrun import launch
from .shared.errors import DDPKitError, LaunchConfigError, LaunchTimeout, RecordError, WorkerError
from .shared.failures import RankFailure
from .shared.records import Records

__all__ = [
    "BackendChoice",
    "CellResult",
    "DDPKitError",
    "LaunchConfigError",
    "LaunchTimeout",
    "RankFailure",
    "RecordError",
    "Records",
    "RunResult",
    "Session",
    "WorkerError",
    "choose_backend",
    "launch",
    "load_ipython_extension",
]


def load_ipython_extension(ipython) -> None:
    """`%load_ext ddp_kit`: the %%torchrun and %ranks magics, and inline figures."""
    from .kernel.magic import register
    from .plots import show_figures_in

    register(ipython)
    show_figures_in(ipython)
