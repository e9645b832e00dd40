"""The alpha-beta model: the fit recovers known links, and the bucket model matches its closed
form and picks the caps the arithmetic says it should."""

from __future__ import annotations

import numpy as np
import pytest

from ddp_kit.costmodel import (
    AlphaBeta,
    algbw,
    best_cap,
    busbw,
    exposed_communication,
    fit,
    model_sweep,
    ring_link,
)

LINK = AlphaBeta(alpha=50e-6, beta=1 / 1.2e9)
SIZES = 2.0 ** np.arange(10, 27)  # 1 KiB .. 64 MiB
MB = 1e6


def test_seconds_is_alpha_plus_beta_times_bytes_for_floats_and_arrays():
    assert LINK.seconds(1.2e9) == pytest.approx(50e-6 + 1.0)
    np.testing.assert_allclose(LINK.seconds(np.array([0.0, 1.2e6])), [50e-6, 50e-6 + 1e-3])
    assert LINK.bandwidth == pytest.approx(1.2e9)


def test_str_gives_alpha_and_bandwidth_in_readable_units():
    assert str(AlphaBeta(alpha=52e-6, beta=1 / 1.23e9)) == "alpha = 52 us, 1/beta = 1.23 GB/s"
    assert str(AlphaBeta(alpha=2.5e-3, beta=1 / 450e6)) == "alpha = 2.5 ms, 1/beta = 450 MB/s"


def test_fit_recovers_alpha_and_beta_exactly_from_noiseless_points():
    link = fit(SIZES, LINK.seconds(SIZES))
    assert link.alpha == pytest.approx(LINK.alpha, rel=1e-9)
    assert link.beta == pytest.approx(LINK.beta, rel=1e-9)


def test_fit_recovers_alpha_and_beta_within_10_percent_from_3_percent_noise():
    rng = np.random.default_rng(0)
    sizes = np.repeat(SIZES, 5)
    times = LINK.seconds(sizes) * rng.uniform(0.97, 1.03, size=sizes.size)
    link = fit(sizes, times)
    assert link.alpha == pytest.approx(LINK.alpha, rel=0.10)
    assert link.beta == pytest.approx(LINK.beta, rel=0.10)


def test_fit_weighs_relative_error_so_small_sizes_fix_alpha():
    # One large point off by 1 %: a relative fit barely moves alpha (an absolute one would not)
    times = LINK.seconds(SIZES)
    times[-1] *= 1.01
    assert fit(SIZES, times).alpha == pytest.approx(LINK.alpha, rel=0.05)


@pytest.mark.parametrize("sizes", [[4096.0], [4096.0, 4096.0, 4096.0]])
def test_fit_needs_two_distinct_sizes(sizes):
    with pytest.raises(ValueError, match="2 or more distinct sizes"):
        fit(sizes, [1e-3] * len(sizes))


@pytest.mark.parametrize("ranks", [2, 4])
def test_ring_link_is_2_n_minus_1_latencies_and_2_n_minus_1_over_n_of_the_bytes(ranks):
    link = ring_link(latency=10e-6, bandwidth=1e9, ranks=ranks)
    size = 8 * MB
    expected = {2: 2 * 10e-6 + 1 * size / 1e9, 4: 6 * 10e-6 + 1.5 * size / 1e9}[ranks]
    assert link.seconds(size) == pytest.approx(expected, rel=1e-12)


def test_busbw_is_algbw_times_2_n_minus_1_over_n():
    assert algbw(64 * MB, 0.1) == pytest.approx(640 * MB)
    assert busbw(64 * MB, 0.1, ranks=4) == pytest.approx(640 * MB * 1.5)
    assert busbw(64 * MB, 0.1, ranks=2) == pytest.approx(640 * MB)
    # a ring's busbw is its link bandwidth, whatever N
    for ranks in (2, 4, 8):
        link = ring_link(latency=0.0, bandwidth=3e9, ranks=ranks)
        assert busbw(64 * MB, link.seconds(64 * MB), ranks) == pytest.approx(3e9)


def closed_form(total, buckets, backward, link):
    """Exposed time for `buckets` equal buckets: max(c, n c - T (n-1)/n), c = one bucket's time."""
    c = link.seconds(total / buckets)
    return max(c, buckets * c - backward * (buckets - 1) / buckets)


@pytest.mark.parametrize(
    "backward, regime",
    [(1.0, "compute-bound: each bucket done before the next is ready"),
     (0.01, "communication-bound: buckets queue up on the link")],
)  # fmt: skip
@pytest.mark.parametrize("buckets", [2, 5, 16])
def test_exposed_communication_matches_the_closed_form_for_equal_buckets(backward, regime, buckets):
    total = 100 * MB
    link = AlphaBeta(alpha=1e-3, beta=1 / 1e9)
    exposed = exposed_communication([total / buckets] * buckets, backward, link)
    assert exposed == pytest.approx(closed_form(total, buckets, backward, link), rel=1e-12)
    one_bucket = link.seconds(total / buckets)
    if backward == 1.0:
        assert exposed == pytest.approx(one_bucket)  # only the last bucket is exposed
    else:
        assert exposed > one_bucket


def test_one_bucket_is_wholly_exposed():
    assert exposed_communication([100 * MB], 0.5, LINK) == pytest.approx(LINK.seconds(100 * MB))


def test_the_link_sends_one_bucket_at_a_time():
    link = AlphaBeta(alpha=0.0, beta=1.0)  # one second per byte
    # backward 4 s: ready at 3 s and 4 s; the first is sent 3..6 s, so the second 6..7 s
    assert exposed_communication([3.0, 1.0], 4.0, link) == pytest.approx(3.0)


def test_model_sweep_cuts_the_total_into_caps_and_a_remainder():
    link = AlphaBeta(alpha=1e-3, beta=1 / 1e9)
    sweep = model_sweep(10 * MB, [4 * MB, 20 * MB], 0.05, link)
    three = exposed_communication([4 * MB, 4 * MB, 2 * MB], 0.05, link)
    assert sweep[4 * MB] == pytest.approx(three)
    assert sweep[20 * MB] == pytest.approx(link.seconds(10 * MB))


CAPS = [2.0**k for k in range(16, 29, 2)]  # 64 KiB .. 256 MiB


def test_with_a_large_alpha_the_biggest_cap_wins():
    link = AlphaBeta(alpha=20e-3, beta=1 / 10e9)
    sweep = model_sweep(100 * MB, CAPS, 0.05, link)
    assert best_cap(sweep) == max(CAPS)


def test_with_a_small_alpha_and_a_slow_link_a_middle_cap_wins():
    link = AlphaBeta(alpha=50e-6, beta=1 / 1e9)
    sweep = model_sweep(100 * MB, CAPS, 0.1, link)
    best = best_cap(sweep)
    assert min(CAPS) < best < max(CAPS)
    assert sweep[best] < sweep[max(CAPS)] / 3  # one bucket: all 0.1 s exposed
    assert sweep[best] < sweep[min(CAPS)]  # tiny buckets: 1500 alphas


def test_best_cap_breaks_ties_towards_the_larger_cap():
    assert best_cap({1.0: 0.5, 2.0: 0.25, 4.0: 0.25, 8.0: 0.75}) == 4.0
    sweep = model_sweep(10 * MB, [16 * MB, 32 * MB], 0.1, LINK)  # both: one bucket
    assert best_cap(sweep) == 32 * MB
