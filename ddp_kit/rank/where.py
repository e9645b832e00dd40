"""Where a live rank's cell is, read from another thread while the cell runs.

The cell's thread may be blocked inside a collective (in C++, where no Python signal handler
runs), so `Whereabouts`, a daemon thread, reads its stack with sys._current_frames(). Once a cell
has run for BUSY_AFTER seconds, it sends the kernel a Busy message every BUSY_EVERY seconds:

    Busy(cell, where, stack, seconds)
        where: "cell line 3: dist.all_reduce(x) (in torch.distributed: all_reduce)"
        stack: every cell frame, "cell line 7: step()" ... "cell line 3: dist.all_reduce(x)",
               then "in torch.distributed: all_reduce (distributed_c10d.py:3252)"

A cell that ends sooner costs nothing. The kernel shows the latest one per rank in the cell's
status line and in `%ranks where` (Session.where()).
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from ..shared.contract import BUSY_AFTER, Busy

BUSY_EVERY = 1.0
_TORCH = f"{os.sep}torch{os.sep}"
_DECORATORS = ("c10d_logger.py",)  # torch's wrappers around the collectives: not the call


def cell_frames(frame: FrameType | None) -> list[FrameType]:
    """The stack's frames, outermost first."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames[::-1]


def describe(frame: FrameType | None) -> tuple[str, str]:
    """Where this stack is, as one line and as a short stack: the cell's lines (their code),
    and the torch function below the innermost one (the innermost torch frame), e.g.
    "cell line 3: dist.all_reduce(x) (in torch.distributed: all_reduce)"."""
    frames = cell_frames(frame)
    cells = [i for i, f in enumerate(frames) if f.f_code.co_filename.startswith("<cell")]
    if not cells:
        return "outside the cell", ""
    lines = [f"cell line {frames[i].f_lineno}: "
             + linecache.getline(frames[i].f_code.co_filename, frames[i].f_lineno).strip()
             for i in cells]  # fmt: skip
    below = frames[cells[-1] + 1 :]
    torch = [f for f in below if _TORCH in f.f_code.co_filename
             and not f.f_code.co_filename.endswith(_DECORATORS)]  # fmt: skip
    if not torch:
        return lines[-1], "\n".join(lines)
    inner = torch[-1]
    package = package_of(inner.f_code.co_filename)
    place = f"{os.path.basename(inner.f_code.co_filename)}:{inner.f_lineno}"
    stack = [*lines, f"in {package}: {inner.f_code.co_name} ({place})"]
    return f"{lines[-1]} (in {package}: {inner.f_code.co_name})", "\n".join(stack)


def package_of(path: str) -> str:
    """ "torch.distributed" for .../torch/distributed/distributed_c10d.py, "torch" for a file
    at the top of the package."""
    inside = path.rsplit(_TORCH, 1)[1].split(os.sep)
    return "torch" if len(inside) == 1 else f"torch.{inside[0]}"


class Whereabouts:
    """The thread that tells the kernel where a long cell is (`send` sends a Busy)."""

    def __init__(self, send: Callable[[tuple], None]) -> None:
        self.send = send
        self.started: float | None = None  # when the running cell started
        self.cell = ""
        self.main = threading.main_thread().ident
        threading.Thread(target=self._run, name="ddp_kit-whereabouts", daemon=True).start()

    def cell_started(self, name: str) -> None:
        self.cell, self.started = name, time.monotonic()

    def cell_ended(self) -> None:
        self.started = None

    def _run(self) -> None:
        while True:
            time.sleep(BUSY_EVERY)
            started = self.started
            if started is None or time.monotonic() - started < BUSY_AFTER:
                continue
            where, stack = describe(sys._current_frames().get(self.main))
            if self.started == started:  # the same cell is still running
                self.send(Busy(self.cell, where, stack, time.monotonic() - started))
