"""ddp_kit: watch PyTorch DistributedDataParallel work, step by step, on real torchrun runs."""

from .backend import BackendChoice, choose_backend
from .errors import DDPKitError, LaunchConfigError, LaunchTimeout, RecordError, WorkerError
from .launcher import launch
from .records import Records
from .result import RankFailure, RunResult

__all__ = [
    "BackendChoice",
    "DDPKitError",
    "LaunchConfigError",
    "LaunchTimeout",
    "RankFailure",
    "RecordError",
    "Records",
    "RunResult",
    "WorkerError",
    "choose_backend",
    "launch",
    "load_ipython_extension",
]


def load_ipython_extension(ipython) -> None:
    """`%load_ext ddp_kit` registers the %%torchrun cell magic."""
    from .magic import register

    register(ipython)
