"""The test run's settings (tests/ and notebooks/ alike).

Set here, before any test, so that `pytest` alone (the README's command, run by ./kit test)
and every child it starts see them: notebook kernels, torchrun agents and ranks.
- DDP_KIT_TEST_RUN: a marker unique to this run; the orphan check counts only processes that
  carry it (tests/support.py).
- PYTHONHASHSEED=0: set and dict orders in notebook outputs are the same every run.
- DDP_KIT_PROGRESS=0: no launch status line in the outputs nbval compares.
- DDP_KIT_NOTES_FILE: launch notes (a launch retried after gloo failed to connect, a crash
  after the work was done) go to artifacts/launch-notes.txt instead of into the outputs nbval
  compares; the file is printed at the end of the run.
- DDP_KIT_CPU_KERNELS (default "default"): which CPU kernels torch uses in every process of
  the run. The notebooks are refreshed with the native kernels, so an output that depends on
  the CPU fails here, on the machine that wrote it. "native" leaves the choice to torch.
"""

from __future__ import annotations

import os
import secrets
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
