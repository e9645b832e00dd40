"""StepExplorer: sliders for step, rank and parameter that redraw the gradient-sync figure."""

from __future__ import annotations

import io

import ipywidgets as widgets
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from . import plots
from .kernel.result import RunResult
from .shared.records import Records


def figure_png(fig: Figure) -> bytes:
    """Render a figure to PNG bytes (headless: no pyplot, no display needed)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    return buffer.getvalue()


def rank_view(records: Records, step: int, rank: int, param: int) -> Figure:
    """One rank at one step: its local gradient vs the synced one, and every rank's value of
    one chosen parameter before and after the all-reduce."""
    local = records["grad_local"][step]
    synced = records["grad_synced"][step]
    labels = plots.parameter_labels(records, local.shape[1])
    fig = Figure(figsize=(9.0, 3.4))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    x = np.arange(local.shape[1])
    left.bar(x, local[rank], color=plots.rank_color(rank), label=f"rank {rank} local")
    left.plot(x, synced[rank], "kx", label="after all-reduce")
    left.axvline(param, color="grey", ls=":")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_xlabel("parameter (flat index)")
    left.set_title(f"step {step}, rank {rank}: local vs synced gradient", fontsize=9)
    left.legend(fontsize=7)
    world = local.shape[0]
    right.bar(range(world), local[:, param], color=[plots.rank_color(r) for r in range(world)])
    right.axhline(synced[0, param], color="black", lw=2, label="synced = mean")
    right.set_xticks(range(world), [f"rank {r}" for r in range(world)], fontsize=7)
    right.set_title(labels[param], fontsize=9)
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig


class StepExplorer(widgets.VBox):
    """Move the sliders to see any rank's gradients at any step, before and after sync."""

    def __init__(self, run: RunResult | Records) -> None:
        self.records = plots.as_records(run)
        steps, world, count = self.records["grad_local"].shape
        self.step = widgets.IntSlider(0, 0, steps - 1, description="step")
        self.rank = widgets.IntSlider(0, 0, world - 1, description="rank")
        self.param = widgets.IntSlider(0, 0, count - 1, description="parameter")
        self.image = widgets.Image(format="png")
        for slider in (self.step, self.rank, self.param):
            slider.observe(self.redraw, names="value")
        super().__init__([widgets.HBox([self.step, self.rank, self.param]), self.image])
        self.redraw()

    def figure(self) -> Figure:
        """The figure for the sliders' current values."""
        return rank_view(self.records, self.step.value, self.rank.value, self.param.value)

    def redraw(self, _change: object = None) -> None:
        """Re-render the figure into the image widget."""
        self.image.value = figure_png(self.figure())
