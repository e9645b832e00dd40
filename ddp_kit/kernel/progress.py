"""One-line statuses, updated in place in JupyterLab: while a launch starts (torchrun,
rendezvous, `import torch` take 10-15 s on a laptop before a rank prints anything), and while a
live cell runs long (where every rank is).

Shown in a Jupyter kernel (a display that updates in place) and in plain IPython on a terminal
(redrawn on stderr), and not with DDP_KIT_PROGRESS=0 (set by the test run and by ./kit
refresh, so the outputs nbval compares never hold it).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..shared import contract
from ..shared.contract import BUSY_AFTER, Busy
from ..shared.markers import STARTED, ranks_marked
from . import output
from .output import RankOutput, span

if TYPE_CHECKING:
    from .channel import Channel

UPDATE_SECONDS = 0.5
# Places (rank.where) that wait for the other ranks: a collective, or a DDP backward, whose
# gradients are all-reduced before it returns.
COLLECTIVES = ("(in torch.distributed: ", "(in torch.autograd: ")


JUPYTER, TERMINAL = "ZMQInteractiveShell", "TerminalInteractiveShell"  # IPython's shells


def shell_kind() -> str | None:
    """JUPYTER (a Jupyter kernel), TERMINAL (plain IPython in a terminal) or None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    kind = type(get_ipython()).__name__
    if kind == TERMINAL and not sys.stderr.isatty():
        return None  # a terminal shell whose output goes to a file: no line to redraw
    return kind if kind in (JUPYTER, TERMINAL) else None


def wanted() -> bool:
    """Whether this process is a Jupyter kernel or a terminal IPython that should show
    progress (not with DDP_KIT_PROGRESS=0)."""
    return os.environ.get(contract.PROGRESS) != "0" and shell_kind() is not None


class StatusLine:
    """One line of text shown in place, refreshed at most every UPDATE_SECONDS: under the
    cell in Jupyter (IPython's display handle), redrawn with a carriage return on a terminal's
    stderr in plain IPython; nothing at all unless `enabled`."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.terminal = enabled and shell_kind() == TERMINAL
        self.start = time.monotonic()
        self.last = 0.0
        self.handle = None
        self.drawn = False  # a terminal line is on screen

    def due(self) -> bool:
        """Whether it is time to refresh the line (then the clock restarts)."""
        now = time.monotonic()
        if not self.enabled or now - self.last < UPDATE_SECONDS:
            return False
        self.last = now
        return True

    def show(self, text: str) -> None:
        """Show `text`, replacing the line (the first call puts it under the cell)."""
        if not self.enabled:
            return
        if self.terminal:
            sys.stderr.write("\r\033[K" + text)  # back to the line's start, clear it, draw
            sys.stderr.flush()
            self.drawn = True
            output.terminal_status_drawn()
        elif self.handle is None:
            from IPython.display import display

            self.handle = display(_Line(text), display_id=True)
        else:
            self.handle.update(_Line(text))

    def end(self, summary: str) -> None:
        """Replace a line that was shown with `[ddp_kit] summary`."""
        if self.terminal and self.drawn:
            output.clear_terminal_status()
            sys.stderr.write(f"[ddp_kit] {summary}\n")
            sys.stderr.flush()
            self.drawn = False
        elif self.handle is not None:
            self.handle.update(_Line(f"[ddp_kit] {summary}"))


class LaunchProgress(StatusLine):
    """Counts ranks started (torchrun created their logs: rendezvous is done) and ranks
    running the script (the runner marked them), and shows it with the elapsed time."""

    def __init__(
        self, output: RankOutput, marker_dir: Path, world_size: int, enabled: bool
    ) -> None:
        super().__init__(enabled)
        self.output = output
        self.marker_dir = Path(marker_dir)
        self.world_size = world_size
        self.show(self._text())

    def update(self) -> None:
        """Refresh the line (at most every UPDATE_SECONDS)."""
        if self.due():
            self.show(self._text())

    def _text(self) -> str:
        elapsed = time.monotonic() - self.start
        started = self.output.ranks_started()
        running = len(ranks_marked(self.marker_dir, STARTED))
        if not started:
            state = "torchrun is starting (rendezvous on 127.0.0.1)"
        else:
            state = (
                f"rendezvous done; {started}/{self.world_size} ranks started, "
                f"{running}/{self.world_size} running the script (after `import torch`)"
            )
        return f"[ddp_kit] {state} · {elapsed:.0f} s"


class StartProgress(StatusLine):
    """While live ranks start: how many connected back, and the seconds; the caller ends it
    with what happened."""

    def __init__(self, world_size: int, enabled: bool) -> None:
        super().__init__(enabled)
        self.world_size = world_size

    def update(self, connected: int) -> None:
        if self.due():
            self.show(f"[ddp_kit] starting {self.world_size} live ranks (torchrun, then "
                      f"`import torch` on each): {connected}/{self.world_size} connected · "
                      f"{time.monotonic() - self.start:.0f} s")  # fmt: skip


class _Line:
    """Plain text shown as it is (a str would be shown with its quotes)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def positions(ranks: list[int], running: set[int], busy: dict[int, Busy], stacks: bool) -> str:
    """Where the cell's ranks are: those that said where (grouped when they are at the same
    place, with the seconds the cell had run), those still running that have not yet said,
    and those done; with `stacks`, each place as its short stack, a paragraph each."""
    places: dict[str, list[int]] = {}
    for rank in sorted(busy):
        if rank in running:
            places.setdefault(busy[rank].stack if stacks else busy[rank].where, []).append(rank)
    parts = []
    for place, group in places.items():
        seconds = max(busy[r].seconds for r in group)
        if stacks:
            parts.append(f"{span(group)}, {seconds:.0f} s into the cell:\n  "
                         + place.replace("\n", "\n  "))  # fmt: skip
        else:
            parts.append(f"{span(group)}: {place}, {seconds:.0f} s")
    said = {rank for group in places.values() for rank in group}
    silent = sorted(running - said)
    if silent:
        parts.append(f"{span(silent)}: running (a rank says where after {BUSY_AFTER:g} s)")
    done = sorted(set(ranks) - running)
    if done:
        parts.append(f"{span(done)}: done")
        if waiting_for_absent(ranks, running, busy) and not stacks:
            parts.append(
                f"{span(done)} finished the cell without that collective: is it under "
                "`if rank == ...`, or after a loop the ranks ran unequally?"
            )
    return ("\n" if stacks else " · ").join(parts)


def waiting_for_absent(ranks: list[int], running: set[int], busy: dict[int, Busy]) -> bool:
    """Whether a running rank waits in a collective (or a backward, which under DDP waits for
    its all-reduces) that ranks done with the cell never joined (they cannot join it now)."""
    places = [busy[r].where for r in running if r in busy]
    in_collective = any(sign in place for place in places for sign in COLLECTIVES)
    return in_collective and bool(set(ranks) - running)


def what_next(collective_timeout: float) -> str:
    """The choice a student has while ranks wait for ranks that are done."""
    return (
        f"The wait fails at the collective timeout ({collective_timeout:g} s); the kit then "
        "frees every rank's process groups and keeps every variable. Interrupt the kernel "
        "(the stop button) to restart the ranks now instead, losing their variables. The fix: "
        "every rank calls the same collectives in the same order."
    )


class CellStatus(StatusLine):
    """While a live cell runs past BUSY_AFTER seconds: one line, updated in place, of where
    each rank is, and when some wait for ranks that are done, what happens next. A cell that
    ends sooner shows nothing."""

    def __init__(
        self, channel: Channel, ranks: list[int], enabled: bool, collective_timeout: float
    ) -> None:
        super().__init__(enabled)
        self.channel, self.ranks = channel, ranks
        self.collective_timeout = collective_timeout

    def update(self) -> None:
        channel = self.channel
        if channel.busy and self.due():
            line = positions(self.ranks, channel.running, channel.busy, stacks=False)
            if waiting_for_absent(self.ranks, channel.running, channel.busy):
                line += " · " + what_next(self.collective_timeout)
            self.show("[ddp_kit] " + line)

    def finish(self) -> None:
        """Replace a shown line with how long the cell ran."""
        seconds = time.monotonic() - self.start
        self.end(f"the cell ran for {seconds:.1f} s on {span(self.ranks)}")
