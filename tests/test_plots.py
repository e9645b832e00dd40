"""Every figure renders headless (Agg) and shows exactly the recorded values."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from matplotlib.patches import Rectangle

from ddp_kit import Records, plots
from ddp_kit.widgets import StepExplorer

matplotlib.use("Agg")

WORLD, STEPS, N = 3, 2, 5


def bucket(index, params, numel, launched, finished):
    return dict(index=index, params=params, numel=numel, launched=launched, finished=finished)


@pytest.fixture
def records():
    """Records shaped like a real run's, with known values (3 ranks, 2 steps, 5 weights)."""
    rng = np.random.default_rng(0)
    local = rng.normal(size=(STEPS, WORLD, N))
    per_rank = []
    for rank in range(WORLD):
        r = {
            "shard": {0: np.array([rank, rank + 3, (rank + 6) % 7])},  # 7 samples, 2 padded
            "grad_local": {s: local[s, rank] for s in range(STEPS)},
            "grad_synced": {s: local[s].mean(axis=0) for s in range(STEPS)},
            "weights": {s: np.full(N, float(s)) for s in range(STEPS)},
            "unsynced_weights": {s: np.full(N, float(s * rank)) for s in range(STEPS)},
            "loss": {s: np.array(10.0 * rank + s) for s in range(STEPS)},
            "param_layout": {0: {"params": [["w", [2, 2]], ["b", [1]]]}},
            "buckets": {
                s: {
                    "buckets": [
                        {
                            "index": 0,
                            "numel": 1,
                            "params": ["b"],
                            "launched": 1.0,
                            "finished": 1.002,
                        },
                        {
                            "index": 1,
                            "numel": 4,
                            "params": ["w"],
                            "launched": 1.001,
                            "finished": 1.005,
                        },
                    ],
                    "ready": {"b": 1.0, "w": 1.0005},
                }
                for s in range(STEPS)
            },
        }
        per_rank.append(r)
    return Records(per_rank)


def test_shard_map_colours_each_sample_by_rank_and_boxes_padding(records):
    fig = plots.shard_map(records)
    ax = fig.axes[0]
    owner = ax.images[0].get_array()
    np.testing.assert_array_equal(owner[0], [1, 2, 3, 1, 2, 3, 1])  # rank + 1 per sample
    boxes = [p for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill()]
    assert sorted(int(b.get_x() + 0.5) for b in boxes) == [0, 1]  # samples 0, 1 given twice
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["rank 0", "rank 1", "rank 2"]


def test_gradient_sync_bars_are_local_grads_and_crosses_the_mean(records):
    ax = plots.gradient_sync(records, step=1).axes[0]
    bars = ax.containers
    assert len(bars) == WORLD
    local = records["grad_local"][1]
    for rank, container in enumerate(bars):
        np.testing.assert_allclose([b.get_height() for b in container], local[rank])
    crosses = [line for line in ax.lines if line.get_marker() == "x"][0]
    np.testing.assert_allclose(crosses.get_ydata(), local.mean(axis=0))
    assert [t.get_text() for t in ax.get_xticklabels()][:2] == ["w[0,0]", "w[0,1]"]


def test_weight_sync_plots_max_difference_per_step(records):
    ax = plots.weight_sync(records).axes[0]
    synced, unsynced = ax.lines
    np.testing.assert_array_equal(synced.get_ydata(), [0.0, 0.0])
    np.testing.assert_array_equal(unsynced.get_ydata(), [0.0, 2.0])


def test_loss_curves_per_rank_and_global(records):
    ax = plots.loss_curves(records, reference=[5.0, 6.0]).axes[0]
    for rank in range(WORLD):
        np.testing.assert_array_equal(ax.lines[rank].get_ydata(), [10.0 * rank, 10.0 * rank + 1])
    np.testing.assert_array_equal(ax.lines[WORLD].get_ydata(), [10.0, 11.0])
    np.testing.assert_array_equal(ax.lines[WORLD + 1].get_ydata(), [5.0, 6.0])


def test_bucket_timeline_has_one_bar_per_bucket_and_rank(records):
    ax = plots.bucket_timeline(records).axes[0]
    widths = sorted(round(p.get_width(), 6) for p in ax.patches)
    assert widths == [2.0] * WORLD + [4.0] * WORLD  # milliseconds in flight
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1", "rank 2"]
    ticks = [np.round(line.get_xdata(), 6).tolist() for line in ax.lines]  # ready ticks, ms
    assert ticks == [[0.0, 0.5]] * WORLD
    lefts = sorted(round(p.get_x(), 6) for p in ax.patches)
    assert lefts == [0.0] * WORLD + [1.0] * WORLD  # bucket 1 launched 1 ms after the first tick


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_ring_allreduce_states_end_with_every_chunk_summed_everywhere(ranks):
    states = plots.ring_allreduce_states(ranks)
    assert len(states) == 2 * (ranks - 1) + 1
    after_reduce_scatter = states[ranks - 1][1]
    assert (after_reduce_scatter == ranks).sum(axis=1).tolist() == [1] * ranks
    assert (states[-1][1] == ranks).all()
    assert len(plots.ring_allreduce(ranks).axes) == len(states)


def test_step_explorer_redraws_when_a_slider_moves(records):
    explorer = StepExplorer(records)
    assert (explorer.step.max, explorer.rank.max, explorer.param.max) == (1, 2, 4)
    first = bytes(explorer.image.value)
    assert first.startswith(b"\x89PNG")
    explorer.param.value = 3
    assert bytes(explorer.image.value) != first
    bars = explorer.figure().axes[1].containers[0]
    np.testing.assert_allclose([b.get_height() for b in bars], records["grad_local"][0][:, 3])
