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


def _shares_a_module_fixture(item) -> bool:
    """Whether the item uses one of the project's own fixtures that outlive a test (a
    module's live session, its torchrun run, a JupyterLab server): set up once per module."""
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        for fixturedef in defs:
            if fixturedef.scope != "function" and fixturedef.baseid:  # "": pytest's, plugins'
                return True
    return False


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups, and before `-m`
def pytest_collection_modifyitems(config, items) -> None:
    """nbval's items (one per notebook cell) carry no marker of their own: every notebook
    starts ranks, so each is `torchrun`, and `-m "not torchrun"` runs no torchrun job; the
    cells of QUICK_NOTEBOOKS are also `quick` (./kit test --quick selects them back).

    Under pytest-xdist with `--dist loadgroup` (./kit test) what must stay in one process is
    one group: a notebook's cells (in order, in one kernel), and a module's tests that share
    a module-wide fixture. Every other test is a unit of its own, for any worker."""
    for item in items:
        if _is_notebook(item):
            item.add_marker(pytest.mark.torchrun)
            if item.path.name in QUICK_NOTEBOOKS:
                item.add_marker(pytest.mark.quick)
            item.add_marker(pytest.mark.xdist_group(item.path.name))
        elif _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.path.name))


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
