"""The test run's settings (tests/ and notebooks/ alike).

Set here, before any test, so that `pytest` alone (the README's command, run by ./kit test)
and every child it starts see them: notebook kernels, torchrun agents and ranks.
- DDP_KIT_TEST_RUN: a marker unique to this run; the orphan check counts only processes that
  carry it (tests/support.py). Under pytest-xdist each worker is a run of its own: it inherits
  the controller's marker and adds its name (PYTEST_XDIST_WORKER, "gw0"), so a worker's orphan
  check never counts another worker's agents, ranks or fork servers.
- PYTHONHASHSEED=0: set and dict orders in notebook outputs are the same every run.
- DDP_KIT_PROGRESS=0: no launch status line in the outputs nbval compares.
- DDP_KIT_NOTES_FILE: launch notes (a launch retried after gloo failed to connect, a crash
  after the work was done) go to artifacts/launch-notes.txt instead of into the outputs nbval
  compares; the file is printed at the end of the run. Every worker appends to the one file
  (each note is one write to a file opened for appending); only the controller empties it.
- DDP_KIT_CPU_KERNELS (default "default"): which CPU kernels torch uses in every process of
  the run. The notebooks are refreshed with the native kernels, so an output that depends on
  the CPU fails here, on the machine that wrote it. "native" leaves the choice to torch.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import pytest

pytest_plugins = ["tools.cpu_profile"]  # --cpu: each test's CPU seconds (docs/testing.md)

ROOT = Path(__file__).resolve().parent
ARTIFACTS = ROOT / os.environ.get("DDP_KIT_ARTIFACTS", "artifacts")

# What each DDP_KIT_CPU_KERNELS value sets (ATen's vectorised kernels, oneDNN's instruction
# set, MKL's code path); keys a machine does not have are ignored by the libraries.
CPU_KERNELS = {
    "native": {},
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                "MKL_CBWR": "COMPATIBLE"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"},
}  # fmt: skip


def _configure() -> None:
    os.environ.setdefault("DDP_KIT_TEST_RUN", secrets.token_hex(8))
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # set by xdist before a worker's conftest
    if worker and not os.environ["DDP_KIT_TEST_RUN"].endswith(f"-{worker}"):
        os.environ["DDP_KIT_TEST_RUN"] += f"-{worker}"
    os.environ.setdefault("PYTHONHASHSEED", "0")
    os.environ.setdefault("DDP_KIT_PROGRESS", "0")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DDP_KIT_NOTES_FILE", str(ARTIFACTS / "launch-notes.txt"))
    choice = os.environ.setdefault("DDP_KIT_CPU_KERNELS", "default")
    if choice not in CPU_KERNELS:
        raise pytest.UsageError(
            f"DDP_KIT_CPU_KERNELS={choice!r}: use one of {', '.join(CPU_KERNELS)}."
        )
    for name, value in CPU_KERNELS[choice].items():
        os.environ.setdefault(name, value)


_configure()


def pytest_sessionstart(session) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:  # the controller (or a run without xdist)
        Path(os.environ["DDP_KIT_NOTES_FILE"]).write_text("")


def pytest_report_header(config) -> str:
    kernels = os.environ["DDP_KIT_CPU_KERNELS"]
    shown = {k: os.environ[k] for k in CPU_KERNELS[kernels] if k in os.environ}
    marker = os.environ["DDP_KIT_TEST_RUN"]
    return f"ddp_kit: CPU kernels {kernels} {shown or ''}, run marker {marker}"


def pytest_terminal_summary(terminalreporter) -> None:
    notes = Path(os.environ["DDP_KIT_NOTES_FILE"])
    if notes.exists() and notes.read_text().strip():
        terminalreporter.section(f"ddp_kit launch notes during the tests ({notes})")
        terminalreporter.write(notes.read_text())


def pytest_configure(config) -> None:
    if getattr(config.option, "nbval_sanitize_with", "absent") is None:
        config.option.nbval_sanitize_with = str(ROOT / "tests" / "nbval_sanitize.cfg")


# The notebooks ./kit test --quick runs (with the tests that launch no torchrun job).
QUICK_NOTEBOOKS = {"00_introduction.ipynb"}


def _is_notebook(item) -> bool:
    return getattr(item, "path", None) is not None and item.path.suffix == ".ipynb"


# Under pytest-xdist, ./kit test runs `--dist loadfile`: a file is one unit of work, run whole
# by one worker (a notebook's cells in order in one kernel; a module's live session, torchrun
# run or JupyterLab server set up once). These files are split into one unit per test instead:
# the slowest, whose tests share nothing but the process (no fixture wider than a test), so
# their waits (collective timeouts, interrupt grace periods, killed kernels) overlap.
SPLIT_FILES = {
    "test_reliability.py", "test_session.py", "test_fast_start.py", "test_wheel.py",
    "test_bench_smoke.py", "test_debugging.py", "test_tutorial.py", "test_examples.py",
    "test_build_it.py", "test_where.py",
}  # fmt: skip
# Under xdist the units start in this order, the longest first, so none is left to run alone
# at the end (docs/testing.md has the durations): these files, then the notebooks, then the
# rest of tests/, each in collection order.
LONGEST_FIRST = [
    "tests/test_hosts.py", "tests/test_bench_smoke.py", "tests/test_wheel.py",
    "tests/test_hosts_lesson.py", "tests/test_hosts_slurm.py",
    "tests/test_launcher.py", "tests/test_solutions.py", "tests/test_examples.py",
    "notebooks/17_when_ddp_pays_off.ipynb",
    "notebooks/22_buckets_and_overlap.ipynb", "tests/test_observe.py",
]  # fmt: skip


def _module_fixtures(item) -> list[str]:
    """The project's fixtures that outlive a test which the item uses (pytest's and plugins'
    own, such as tmp_path_factory, have no base id and are left out)."""
    info = getattr(item, "_fixtureinfo", None)
    return [name for name, defs in (info.name2fixturedefs.items() if info else ())
            if any(d.scope != "function" and d.baseid for d in defs)]  # fmt: skip


@pytest.hookimpl(optionalhook=True)  # a venv without pytest-xdist has no such hook
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with each test of SPLIT_FILES a unit of its own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SplitSlowFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if Path(path).name in SPLIT_FILES else path

    config.option.loadscopereorder = False  # the order is LONGEST_FIRST's (below)
    return SplitSlowFiles(config, log)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items) -> None:
    """nbval's items (one per notebook cell) carry no marker of their own: every notebook
    starts ranks, so each is `torchrun`, and `-m "not torchrun"` runs no torchrun job; the
    cells of QUICK_NOTEBOOKS are also `quick` (./kit test --quick selects them back).
    A test of SPLIT_FILES may use no fixture wider than a test (it may run in any worker)."""
    for item in items:
        if _is_notebook(item):
            item.add_marker(pytest.mark.torchrun)
            if item.path.name in QUICK_NOTEBOOKS:
                item.add_marker(pytest.mark.quick)
        elif item.path.name in SPLIT_FILES and _module_fixtures(item):
            raise pytest.UsageError(
                f"{item.nodeid} uses {_module_fixtures(item)}, set up once per module, but "
                f"conftest.py SPLIT_FILES lets its tests run in different workers: take "
                f"{item.path.name} out of SPLIT_FILES"
            )
    if "PYTEST_XDIST_WORKER" in os.environ:  # every worker sorts alike: the same collection

        def start(item) -> tuple[int, int]:
            path = item.path.relative_to(ROOT).as_posix()
            if path in LONGEST_FIRST:
                return 0, LONGEST_FIRST.index(path)
            return (1 if _is_notebook(item) else 2), 0

        items.sort(key=start)  # stable: a file's tests keep their order


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a notebook's last cell, once nbval has shut its kernel down: no agent, rank or
    fork server of this run (this worker's) may be left. The notebooks start the most ranks,
    and the tests' own check (tests/conftest.py) never runs after them; a process left fails
    the run as an error in the last cell's teardown."""
    result = yield
    if _is_notebook(item) and (nextitem is None or nextitem.path != item.path):
        if str(ROOT / "tests") not in sys.path:
            sys.path.insert(0, str(ROOT / "tests"))
        from support import wait_until_gone

        left = wait_until_gone(15)
        assert not left, f"processes left running after {item.path.name}: {left}"
    return result
