"""`python -m ddp_kit.rank.runner SCRIPT ARGS`: what torchrun starts on every rank.

It bootstraps the rank (dies with its agent, a short collective timeout, error reports, a clean
exit), then runs SCRIPT as __main__, so tracebacks point at the script's own line numbers, with
the imports Python would find (`import_path`).
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import os
import runpy
import sys
from datetime import timedelta
from pathlib import Path
from types import TracebackType

from .. import worker
from ..shared import contract, failures, markers
from ..shared.processes import die_with_parent, end_data_loader_workers
from . import groups, waits

_script: str | None = None


def main() -> None:
    """Bootstrap this rank, run the script with its own argv, then end the rank cleanly."""
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path[0:1] = import_path(script)
    bootstrap(script)
    try:
        namespace = runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        if exit.code not in (None, 0):  # reported (its stderr stays as plain Python leaves it)
            error_dir = os.environ.get(contract.ERROR_DIR)
            if error_dir is not None:
                failure = failures.from_exception(worker.rank(), exit, exit.__traceback__, script)
                failures.write_report(error_dir, failure)
            raise  # the rank ends with the script's exit code, as under plain Python
        namespace = _script_globals(exit.__traceback__, script)  # sys.exit(0): a normal end
    end_rank(namespace)


def _script_globals(tb: TracebackType | None, script: str) -> dict:
    """The globals of the script that raised SystemExit (runpy returns none then)."""
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == script:
            return tb.tb_frame.f_globals
        tb = tb.tb_next
    return {}


def import_path(script: str) -> list[str]:
    """Where the script's imports are looked for first: what replaces sys.path[0].

    A rank's working directory is the notebook's folder (ranks inherit the kernel's). A .py
    file of the user's gets its own folder first, as `python script.py` does, then the
    notebook's folder; code the kit wrote into the run directory (a cell, a function, the
    live-rank server) gets the notebook's folder alone, as the cell would in the kernel. So a
    `helper.py` or `datautils.py` beside the notebook is imported as it is there.
    """
    notebook_folder = os.getcwd()
    if contract.written_by_kit(script):
        return [notebook_folder]
    own_folder = str(Path(script).resolve().parent)
    return list(dict.fromkeys([own_folder, notebook_folder]))


def end_rank(namespace: dict) -> None:
    """The script returned: save its records, mark the rank completed, free what the script
    built (but its last process groups) while the interpreter is fully alive, then exit
    without the interpreter's teardown.

    destroy_process_group() does not free a process group that DDP still holds; freed during
    the interpreter's teardown instead, gloo's threads can abort a rank whose work is done
    ("terminate called without an active exception"). Exit handlers still run, and files the
    script left open are closed when its namespace is freed.

    The groups still kept when the script returns (its last destroyed generation: rank.groups)
    are never freed: os._exit ends their threads. Freed here, a group's last reference could
    be dropped on one of its own gloo threads, by a future callback that a comm hook chained
    with `.then` (GradientRecorder's holds the recorder, which holds the group), and the
    group's destructor then joins that very thread: "terminate called after throwing an instance of
    'std::system_error' what(): Resource deadlock avoided" (how often: docs/reliability.md;
    tests/test_reliability.py)."""
    worker.flush()
    markers.mark(markers.COMPLETED, worker.rank())
    worker.forget_flush_callbacks()
    end_data_loader_workers()  # before the collector frees them: processes.py says why
    namespace.clear()
    gc.collect()
    _destroy_process_group()  # groups.install() keeps the destroyed groups: not released
    gc.collect()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def bootstrap(script: str | None = None) -> None:
    """Prepare a rank: die with the agent, short collective timeout, destroyed process groups
    freed at a safe point or kept until the rank exits (rank.groups), a bound on waits with no
    timeout (rank.waits), error reports, clean exit.

    Reported tracebacks start at `script` (the runner's own frames are left out).
    """
    global _script
    _script = script
    die_with_parent()
    keep_earlier_attempt(worker.rank())
    shorten_default_collective_timeout()
    groups.install()
    if contract.COLLECTIVE_TIMEOUT in os.environ:
        waits.start(worker.rank(), collective_timeout(), _end_stalled_rank)
    sys.excepthook = _report_exception
    _record_crashes()
    atexit.register(_destroy_process_group)
    markers.mark(markers.STARTED, worker.rank())


def keep_earlier_attempt(rank: int) -> None:
    """After torchrun restarted the ranks (--max-restarts), move this rank's report and fault
    file of the attempt before into errors/attempt<K>/, and remove its completed marker: the
    kernel reads errors/ and markers/ as the last attempt's, and errors/attempt<K>/ as
    attempt K's."""
    attempt = int(os.environ.get(contract.RESTART_COUNT, "0"))
    error_dir = os.environ.get(contract.ERROR_DIR)
    if attempt == 0 or error_dir is None:
        return
    earlier = Path(contract.earlier_attempt(error_dir, attempt - 1))
    earlier.mkdir(exist_ok=True)
    for path in (failures.report_file(error_dir, rank), failures.fault_file(error_dir, rank)):
        if path.exists() and path.stat().st_size:
            path.replace(earlier / path.name)
    marker_dir = os.environ.get(contract.MARKER_DIR)
    if marker_dir:
        (Path(marker_dir) / f"{markers.COMPLETED}{rank}").unlink(missing_ok=True)


def collective_timeout() -> timedelta:
    """How long a collective waits for the other ranks before raising (set by the launcher)."""
    return timedelta(seconds=float(os.environ.get(contract.COLLECTIVE_TIMEOUT, "1800")))


def shorten_default_collective_timeout() -> None:
    """Make init_process_group's default timeout the launcher's, so a hang becomes an error."""
    if contract.COLLECTIVE_TIMEOUT not in os.environ:
        return
    import torch.distributed.distributed_c10d as c10d

    c10d.default_pg_timeout = collective_timeout()
    if getattr(c10d, "default_pg_nccl_timeout", None) is not None:
        c10d.default_pg_nccl_timeout = collective_timeout()


def _report_exception(
    kind: type[BaseException], error: BaseException, tb: TracebackType | None
) -> None:
    """Write the uncaught exception for the launcher, and a one-line notice to stderr."""
    error_dir = os.environ.get(contract.ERROR_DIR)
    if error_dir is None:
        sys.__excepthook__(kind, error, tb)
        return
    failures.write_report(error_dir, failures.from_exception(worker.rank(), error, tb, _script))
    # sys.__stderr__: init_process_group wraps the excepthook and would prefix "[rankN]:".
    where = "the launch error"
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:  # torchrun may restart it
        where += f", or result.attempts[{os.environ.get(contract.RESTART_COUNT, '0')}]"
    notice = f"{kind.__name__}: {error}  (traceback in {where})"
    print(notice, file=sys.__stderr__, flush=True)


def _record_crashes() -> None:
    """Python's faulthandler writes where the rank was if it dies of a fatal signal (SIGSEGV,
    SIGABRT, ...) into errors/fault-rank<R>.txt, which the launch error quotes (the rank's
    own stderr is left as it is)."""
    error_dir = os.environ.get(contract.ERROR_DIR)
    if error_dir is None:
        return
    global _fault_file
    _fault_file = open(failures.fault_file(error_dir, worker.rank()), "w")  # noqa: SIM115
    faulthandler.enable(_fault_file, all_threads=False)


_fault_file = None  # kept open for faulthandler until the rank ends


def _end_stalled_rank(failure: failures.RankFailure) -> None:
    """A wait with no end of its own (rank.waits): report it as this rank's error, and exit."""
    error_dir = os.environ.get(contract.ERROR_DIR)
    if error_dir is not None:
        failures.write_report(error_dir, failure)
    print(f"{failure.type}: {failure.message}", file=sys.__stderr__, flush=True)
    os._exit(1)


def _destroy_process_group() -> None:
    """Tear down the process group if the script forgot to (avoids aborts at exit)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
