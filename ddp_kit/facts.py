"""A lesson's numeric facts, asserted in the cell and printed with their tolerance.

Two runs that should agree often agree only up to float32 rounding, and the last digits of that
rounding differ from CPU to CPU (other vector kernels add in another order). So a notebook never
prints the digits of such a difference where its output is compared; it states the fact:

    same_up_to_rounding(ddp_grad, one_process_grad, "DDP vs one process")
    # DDP vs one process: equal up to float32 rounding (max |diff| < 1e-05 x max |value|)

and the cell fails if the fact stops holding. The exact figure, `gap(a, b)`, may be printed
in a cell whose output is not compared (tag nbval-ignore-output).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .shared.records import to_numpy

ROUNDING = 1e-5  # float32 keeps 24 bits (about 6e-8 relative); 1e-5 leaves room for sums


def _array(value: Any) -> np.ndarray:
    return np.asarray(to_numpy(value), dtype=np.float64)


def _pair(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
    """`a` and `b` as float64 arrays of one shape (numpy broadcasting: [rank, n] against [n])."""
    return np.broadcast_arrays(_array(a), _array(b))


def gap(a: Any, b: Any) -> float:
    """max |a - b| over every element."""
    a, b = _pair(a, b)
    return float(np.abs(a - b).max())


def same_bits(a: Any, b: Any, what: str) -> None:
    """Assert that `a` and `b` are the same numbers exactly, bit for bit."""
    a, b = _pair(a, b)
    if not np.array_equal(a, b):
        raise AssertionError(f"{what}: not bit for bit the same (max |diff| = {gap(a, b):.3g})")
    print(f"{what}: the same numbers, bit for bit")


def same_up_to_rounding(a: Any, b: Any, what: str, rel: float = ROUNDING) -> None:
    """Assert max |a - b| < rel x max |b|: equal up to float32 rounding."""
    a, b = _pair(a, b)
    measured, scale = gap(a, b), float(np.abs(b).max())
    if not measured <= rel * scale:
        raise AssertionError(
            f"{what}: max |diff| = {measured:.3g}, more than float32 rounding "
            f"({rel:g} x max |value| = {rel * scale:.3g})"
        )
    tolerance = f"{rel:g}".replace("e-0", "e-")
    print(f"{what}: equal up to float32 rounding (max |diff| < {tolerance} x max |value|)")


def within(value: float, reference: float, rel: float, what: str) -> None:
    """Assert |value - reference| <= rel x |reference| (a trajectory's stated tolerance)."""
    difference = abs(float(value) - float(reference))
    if not difference <= rel * abs(float(reference)):
        raise AssertionError(
            f"{what}: {float(value):.4g} is {difference / abs(float(reference)):.1%} from "
            f"{float(reference):.4g}, more than {rel * 100:g} %"
        )
    print(f"{what}: within {rel * 100:g} %")
