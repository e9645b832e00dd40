"""The committed notebooks, read as files: what nbval compares must be the same on any machine.

A number below 1e-5 printed with its digits is float32 rounding noise (it differs from CPU to
CPU); a lesson states such a fact with its tolerance and asserts it in the cell, and prints the
exact figure only in a cell whose output is not compared (tag nbval-ignore-output). Test
plumbing lives in cell tags, not in the code students read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
IGNORED = {"nbval-ignore-output", "nbval-skip"}
# 4.8e-07, 1.5e-08, 2e-06 or 0.0000012: rounding-level digits (1e-05 written as 1e-05 counts)
NOISE = re.compile(r"(?<![\w.])\d(?:\.\d+)?e-(?:0[5-9]|[1-9]\d)\b|(?<![\w.])0\.0000\d+")
MARKER = re.compile(r"#\s*NBVAL_[A-Z_]+")


def code_cells(path: Path) -> list[tuple[int, dict]]:
    cells = json.loads(path.read_text())["cells"]
    return [(i, cell) for i, cell in enumerate(cells) if cell["cell_type"] == "code"]


def compared_text(cell: dict) -> str:
    """The text nbval compares of one cell: its stdout, stderr and text/plain outputs."""
    if IGNORED & set(cell.get("metadata", {}).get("tags", [])):
        return ""
    parts = []
    for output in cell.get("outputs", []):
        parts.append("".join(output.get("text", "")))
        parts.append("".join(output.get("data", {}).get("text/plain", "")))
    return "".join(parts)


def test_the_noise_pattern_finds_rounding_digits_and_nothing_else():
    for noisy in ("max |diff| = 4.8e-07", "error 1.5e-08", "2e-06", "0.0000012"):
        assert NOISE.search(noisy), noisy
    for clean in ("max |diff| < 1e-4", "loss 0.4880", "1.0e-03", "3.0e-4", "25,348 B", "0.0001"):
        assert not NOISE.search(clean), clean


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_compared_output_prints_rounding_noise(path):
    noisy = [f"cell {i}: {m.group(0)}" for i, cell in code_cells(path)
             for m in NOISE.finditer(compared_text(cell))]  # fmt: skip
    assert not noisy, f"{path.name} prints float32 rounding digits nbval compares: {noisy}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nbval_markers_are_tags_not_code(path):
    marked = [i for i, cell in code_cells(path) if MARKER.search("".join(cell["source"]))]
    assert not marked, f"{path.name} cells {marked}: use nbval-* cell tags instead"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_code_cell_was_executed_in_order(path):
    counts = [cell["execution_count"] for _, cell in code_cells(path)]
    assert None not in counts, f"{path.name}: cells never executed in the reference"
    assert counts == sorted(counts) and len(set(counts)) == len(counts)
