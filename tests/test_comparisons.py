"""Every comparison figure renders headless (Agg) and plots exactly the values it is given, with
its labels and title (read back from the Figure's artists)."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from matplotlib.colors import to_rgba
from matplotlib.patches import Rectangle

from ddp_kit import comparisons
from ddp_kit.costmodel import AlphaBeta

matplotlib.use("Agg")


def legend_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_variant_losses_draws_each_variants_curve_in_its_own_style():
    losses = {"allreduce": [4.0, 2.0, 1.0], "fp16": [4.0, 2.5, 1.5, 0.5], "powerSGD": [3.0, 3.0]}
    fig = comparisons.variant_losses(losses, title="Loss per hook", xlabel="epoch")
    ax = fig.axes[0]
    assert len(ax.lines) == 3
    for line, (name, values), (color, style) in zip(
        ax.lines, losses.items(), comparisons.VARIANT_STYLES, strict=False
    ):
        assert line.get_label() == name
        np.testing.assert_array_equal(line.get_xdata(), range(len(values)))
        np.testing.assert_array_equal(line.get_ydata(), values)
        assert to_rgba(line.get_color()) == to_rgba(color) and line.get_linestyle() == style
    assert len({(line.get_color(), line.get_linestyle()) for line in ax.lines}) == 3
    assert ax.get_yscale() == "log"
    assert (ax.get_title(), ax.get_xlabel()) == ("Loss per hook", "epoch")
    assert ax.get_ylabel() == "global loss (mean over ranks)"
    assert legend_texts(ax) == ["allreduce", "fp16", "powerSGD"]


def test_hook_tradeoff_puts_each_hook_at_its_bytes_and_error_with_the_exact_one_on_the_floor():
    sent = {"allreduce": 25_348, "fp16": 12_674, "powerSGD r=1": 1_668}
    errors = {"allreduce": 0.0, "fp16": 3.1e-4, "powerSGD r=1": 0.75}
    ax = comparisons.hook_tradeoff(sent, errors, floor=1e-7).axes[0]
    points = [tuple(c.get_offsets()[0]) for c in ax.collections]
    assert points == [(25_348, 1e-7), (12_674, 3.1e-4), (1_668, 0.75)]  # error 0: on the floor
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["  allreduce\n  exact (0)", "  fp16\n  3.1e-04", "  powerSGD r=1\n  7.5e-01"]
    assert [t.xy for t in ax.texts] == points
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlim() == pytest.approx((1_668 / 2, 25_348 * 4))
    assert ax.get_title() == "Fewer bytes, larger gradient error"
    assert ax.get_xlabel() == "bytes all-reduced per step, per rank (log)"
    assert ax.get_ylabel() == "|synced - exact average| / |exact|"


def test_memory_per_rank_stacks_each_part_in_kib_per_variant_and_rank():
    usage = {
        "DDP": [{"params": 2048, "grads": 2048, "buckets": 2048, "optimizer": 4096}] * 2,
        "ZeRO": [{"params": 2048, "grads": 2048, "optimizer": 1024},
                 {"params": 2048, "grads": 2048, "optimizer": 3072}],
    }  # fmt: skip
    ax = comparisons.memory_per_rank(usage).axes[0]
    bars = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(bars) == 2 * 2 * 4  # variants x ranks x parts (a missing part: a bar of 0)
    width = 0.8 / 2
    for i, bar in enumerate(bars):
        variant, rank, part = i // 8, i // 4 % 2, list(comparisons.MEMORY_PARTS)[i % 4]
        parts = usage[list(usage)[variant]][rank]
        below = sum(parts.get(p, 0) for p in list(comparisons.MEMORY_PARTS)[: i % 4]) / 1024
        assert bar.get_x() + bar.get_width() / 2 == pytest.approx(variant + (rank - 0.5) * width)
        assert bar.get_height() == parts.get(part, 0) / 1024, (variant, rank, part)
        assert bar.get_y() == below
        assert bar.get_facecolor() == to_rgba(comparisons.MEMORY_PARTS[part])
    tops = [(t.get_text(), t.get_position()[1]) for t in ax.texts]
    assert tops == [("r0", 10.0), ("r1", 10.0), ("r0", 5.0), ("r1", 7.0)]  # KiB held
    assert [t.get_text() for t in ax.get_xticklabels()] == ["DDP", "ZeRO"]
    assert legend_texts(ax) == ["params", "grads", "buckets", "optimizer"]
    assert ax.get_ylabel() == "KiB on each rank"
    assert ax.get_title() == "What each rank holds (bars: ranks 0, 1, ...)"


def test_join_rounds_marks_the_rounds_each_rank_trained_and_shadowed():
    batches, rounds = [3, 1, 2], 3
    ax = comparisons.join_rounds(batches, rounds).axes[0]
    bars = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(bars) == 3 * 3
    green = to_rgba("#2ca02c")
    for i, bar in enumerate(bars):
        rank, r = divmod(i, rounds)
        trained = r < batches[rank]
        assert bar.get_x() == pytest.approx(r - 0.45) and bar.get_y() == pytest.approx(rank - 0.4)
        assert bar.get_facecolor() == (green if trained else to_rgba("white")), (rank, r)
        assert bar.get_hatch() == (None if trained else "//")
    words = [(t.get_text(), t.get_position()) for t in ax.texts]
    assert words == [("batch" if r < batches[rank] else "zeros", (r, rank))
                     for rank in range(3) for r in range(rounds)]  # fmt: skip
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1", "rank 2"]
    assert list(ax.get_xticks()) == [0, 1, 2]
    assert ax.yaxis_inverted()
    assert ax.get_title() == "Join: green = a real batch, hatched = shadowing with zeros"
    assert ax.get_xlabel() == "all-reduce round (one per training step of the busiest rank)"


def test_speedup_plots_one_rank_over_n_ranks_beside_the_ideal():
    seconds = {"CNN": {1: 0.246, 2: 0.166, 4: 0.174}, "TinyNet": {1: 0.091, 2: 0.356, 4: 0.472}}
    ax = comparisons.speedup(seconds).axes[0]
    ideal, cnn, tiny = ax.lines
    assert ideal.get_label() == "ideal: n ranks, n times faster"
    np.testing.assert_array_equal(ideal.get_xdata(), [1, 2, 4])
    np.testing.assert_array_equal(ideal.get_ydata(), [1, 2, 4])
    for line, name in ((cnn, "CNN"), (tiny, "TinyNet")):
        times = seconds[name]
        assert line.get_label() == name
        np.testing.assert_array_equal(line.get_xdata(), [1, 2, 4])
        np.testing.assert_allclose(line.get_ydata(), [times[1] / times[n] for n in (1, 2, 4)])
    np.testing.assert_allclose(tiny.get_ydata(), [1.0, 0.091 / 0.356, 0.091 / 0.472])
    assert list(ax.get_xticks()) == [1, 2, 4]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("ranks", "speedup over 1 rank")
    assert ax.get_title() == "Time per epoch: 1 rank / n ranks"
    assert legend_texts(ax) == ["ideal: n ranks, n times faster", "CNN", "TinyNet"]


def test_exposed_by_cap_plots_the_measured_points_and_the_models_line_in_ms():
    caps = [0.5, 1, 25]
    measured = {0.5: 0.012, 1: 0.010, 25: 0.030}
    predicted = {0.5: 0.011, 1: 0.009, 25: 0.028}
    ax = comparisons.exposed_by_cap(caps, measured, predicted, title="On 1 Gbit/s").axes[0]
    model, points = ax.lines
    assert model.get_label() == "model (costmodel.exposed_communication)"
    assert model.get_linestyle() == "--"
    np.testing.assert_array_equal(model.get_xdata(), caps)
    np.testing.assert_allclose(model.get_ydata(), [11, 9, 28])
    assert points.get_label() == "measured"
    np.testing.assert_array_equal(points.get_xdata(), caps)
    np.testing.assert_allclose(points.get_ydata(), [12, 10, 30])
    assert ax.get_xscale() == "log" and ax.get_ylim()[0] == 0
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.5", "1", "25"]
    assert ax.get_xlabel() == "bucket_cap_mb (MiB)"
    assert ax.get_ylabel() == "exposed communication (ms)"
    assert ax.get_title() == "On 1 Gbit/s"
    assert legend_texts(ax) == ["model (costmodel.exposed_communication)", "measured"]
    default = comparisons.exposed_by_cap(caps, measured, predicted).axes[0]
    assert default.get_title() == "Exposed communication per step"


def test_alpha_beta_plots_times_with_each_fit_and_the_bus_bandwidth():
    sizes = [1024, 65536, 4194304]
    seconds = {2: [1e-3, 2e-3, 40e-3], 4: [6e-3, 8e-3, 90e-3]}
    fits = {2: AlphaBeta(1e-3, 1e-8), 4: AlphaBeta(6e-3, 2e-8)}
    fig = comparisons.alpha_beta(sizes, seconds, fits)
    left, right = fig.axes
    assert len(left.lines) == 4 and len(right.lines) == 2  # points and fit per rank count
    for i, ranks in enumerate((2, 4)):
        points, fit = left.lines[2 * i : 2 * i + 2]
        assert points.get_label() == f"{ranks} ranks, measured"
        np.testing.assert_array_equal(points.get_xdata(), sizes)
        np.testing.assert_array_equal(points.get_ydata(), seconds[ranks])
        assert fit.get_label() == f"fit: {fits[ranks]}"
        line = fit.get_xdata()
        assert len(line) == 100 and (line[0], line[-1]) == pytest.approx((1024, 4194304))
        np.testing.assert_allclose(fit.get_ydata(), fits[ranks].alpha + fits[ranks].beta * line)
        assert to_rgba(points.get_color()) == to_rgba(fit.get_color())
        bus = right.lines[i]
        assert bus.get_label() == f"{ranks} ranks"
        np.testing.assert_array_equal(bus.get_xdata(), sizes)
        # busbw = S / t x 2(N-1)/N, in MB/s: x1 at 2 ranks, x1.5 at 4
        factor = 2 * (ranks - 1) / ranks
        expected = [s / t * factor / 1e6 for s, t in zip(sizes, seconds[ranks], strict=True)]
        np.testing.assert_allclose(bus.get_ydata(), expected)
    np.testing.assert_allclose(right.lines[1].get_ydata()[0], 1024 / 6e-3 * 1.5 / 1e6)
    assert left.get_xscale() == left.get_yscale() == "log" and right.get_xscale() == "log"
    assert left.get_title() == "t(S) = alpha + beta x S"
    assert left.get_xlabel() == "bytes per rank (S)"
    assert left.get_ylabel() == "seconds per all-reduce"
    assert right.get_title() == "Bus bandwidth: S / t x 2(N-1)/N"
    assert (right.get_xlabel(), right.get_ylabel()) == ("bytes per rank (S)", "busbw (MB/s)")
    assert legend_texts(right) == ["2 ranks", "4 ranks"]
    assert legend_texts(left)[1] == "fit: alpha = 1 ms, 1/beta = 100 MB/s"
