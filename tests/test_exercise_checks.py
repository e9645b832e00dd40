"""Unit tests of five exercise checks of notebooks 21-25, on synthetic inputs whose right answer
is worked out here by hand: alpha-beta fits (ddp_kit.costmodel), bucket sweeps, merged traces.
Each check must say "Correct!" to the right answer, "Not quite" to wrong ones, and return None
(asking for an answer) to None."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ddp_kit import costmodel
from ddp_kit.exercises import (
    check_bucket_choice,
    check_bucket_count,
    check_half_bandwidth,
    check_one_bucket_overlap,
    check_restart_cost,
)

NOT_ANSWERED = "Not answered yet"

# --- notebook 21: the size at which beta x S = alpha ----------------------------------------

# alpha = 200 us a call, 1/beta = 500 MB/s: beta x S = alpha at S = 2e-4 / 2e-9 = 100,000 bytes
ALPHA, BETA, HALF = 2e-4, 2e-9, 100_000


@pytest.fixture(params=["given", "fitted"])
def fit(request):
    """The same alpha-beta model, given, or fitted to exact times at 1 KiB .. 64 MiB."""
    if request.param == "given":
        return costmodel.AlphaBeta(alpha=ALPHA, beta=BETA)
    sizes = 2.0 ** np.arange(10, 27, 2)
    return costmodel.fit(sizes, ALPHA + BETA * sizes)


@pytest.mark.parametrize(
    "answer",
    [HALF, 100_000.0, np.int64(HALF), np.float32(HALF), torch.tensor(float(HALF)),
     1.04 * HALF, 0.96 * HALF],  # fmt: skip
)
def test_half_bandwidth_accepts_alpha_over_beta_within_5_percent(fit, answer, capsys):
    assert check_half_bandwidth(answer, fit) is True
    out = capsys.readouterr().out
    assert out.startswith("Correct! ") and "100,000 bytes" in out


@pytest.mark.parametrize(
    "answer",
    [1.06 * HALF, 0.94 * HALF, BETA / ALPHA, ALPHA * BETA, 1 / BETA, 2 * HALF, 0, -HALF,
     "100000", [HALF], True],  # fmt: skip
)
def test_half_bandwidth_refuses_other_sizes_and_non_numbers(fit, answer, capsys):
    assert check_half_bandwidth(answer, fit) is False
    out = capsys.readouterr().out
    assert out.startswith("Not quite: you said ") and "100,000 bytes" in out


def test_half_bandwidth_waits_for_an_answer(fit, capsys):
    assert check_half_bandwidth(None, fit) is None
    assert capsys.readouterr().out.startswith(NOT_ANSWERED)


def test_half_bandwidth_follows_the_fit_it_is_given(capsys):
    """Another run's fit, another answer: alpha 1 ms with 1/beta 1 GB/s gives 1,000,000 bytes."""
    other = costmodel.AlphaBeta(alpha=1e-3, beta=1e-9)
    assert check_half_bandwidth(1_000_000, other) is True
    assert check_half_bandwidth(HALF, other) is False
    assert "1,000,000 bytes" in capsys.readouterr().out


# --- notebook 22: the bucket cap with the least exposed communication ------------------------

MEASURED = {0.25: 0.030, 1: 0.012, 4: 0.0125, 25: 0.040}  # seconds exposed; best: 1 MiB


@pytest.fixture
def predicted():
    """The overhead model's sweep for the same caps (MiB): 12 MiB of gradients, a 20 ms
    backward, 1 Gbit/s Ethernet between 2 ranks."""
    link = costmodel.ring_link(*(50e-6, 1e9 / 8), ranks=2)
    caps = list(MEASURED)
    sweep = costmodel.model_sweep(12 * 2**20, [c * 2**20 for c in caps], 0.020, link)
    return dict(zip(caps, sweep.values(), strict=True))


@pytest.mark.parametrize("cap", [1, 1.0, np.float64(1.0), 4])  # 4: 12.5 ms, within 5 % of 12
def test_bucket_choice_accepts_the_least_exposed_cap_within_5_percent(cap, predicted, capsys):
    assert check_bucket_choice(cap, MEASURED, predicted) is True
    out = capsys.readouterr().out
    assert out.startswith(f"Correct! {cap:g} MiB: {1e3 * MEASURED[cap]:.1f} ms exposed")
    modelled = min(predicted, key=predicted.get)
    assert f"The model's pick: {modelled:g} MiB" in out


@pytest.mark.parametrize("cap", [0.25, 25])
def test_bucket_choice_refuses_a_cap_that_exposes_more(cap, predicted, capsys):
    assert check_bucket_choice(cap, MEASURED, predicted) is False
    out = capsys.readouterr().out
    assert out.startswith(f"Not quite: {cap:g} MiB exposed {1e3 * MEASURED[cap]:.1f} ms; "
                          "1 MiB exposed 12.0 ms.")  # fmt: skip


def test_bucket_choice_judges_by_the_measured_sweep_not_the_model(capsys):
    """The model prefers 25 MiB here; the measurement says 1 MiB, and the measurement wins."""
    model_says = {0.25: 0.05, 1: 0.04, 4: 0.03, 25: 0.01}
    assert check_bucket_choice(25, MEASURED, model_says) is False
    assert check_bucket_choice(1, MEASURED, model_says) is True
    assert "The model's pick: 25 MiB" in capsys.readouterr().out


def test_bucket_choice_refuses_a_cap_outside_the_sweep_and_waits_for_an_answer(predicted, capsys):
    assert check_bucket_choice(2, MEASURED, predicted) is False
    assert "2 is not one of the caps of the sweep: [0.25, 1, 4, 25]" in capsys.readouterr().out
    assert check_bucket_choice(None, MEASURED, predicted) is None
    assert capsys.readouterr().out.startswith(NOT_ANSWERED)


def test_bucket_choice_at_exactly_5_percent_is_correct_and_past_it_is_not(capsys):
    measured = {1: 0.020, 4: 0.021, 25: 0.0211}  # 4: +5.0 %, 25: +5.5 %
    assert check_bucket_choice(4, measured, measured) is True
    assert check_bucket_choice(25, measured, measured) is False


# --- notebook 23: one bucket, one all-reduce per rank ----------------------------------------


def event(rank, name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": rank, "tid": tid, "ts": ts, "dur": dur}


def merged(all_reduces):
    """A merged trace of 2 ranks (as tracing.merge gives): on the main thread a forward
    (0-40 us) and a backward (50-150 us); on gloo's thread the given all-reduces per rank."""
    events = []
    for rank, spans in all_reduces.items():
        events += [
            event(rank, "DistributedDataParallel.forward", 0.0, 40.0, cat="user_annotation"),
            event(rank, "aten::linear", 0.0, 40.0),
            event(rank, "autograd::engine::evaluate_function: AddmmBackward0", 50.0, 100.0),
        ]
        events += [event(rank, "gloo:all_reduce", ts, dur, tid=2, cat="user_annotation")
                   for ts, dur in spans]  # fmt: skip
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "ts": 0.0,
                       "args": {"name": f"rank {rank}"}})  # fmt: skip
    return {"traceEvents": events}


def test_one_bucket_overlap_accepts_one_all_reduce_per_rank_and_shows_the_shares(capsys):
    # rank 0: 150-250, after backward: 0 % overlap; rank 1: 100-200, half under backward: 50 %
    trace = merged({0: [(150.0, 100.0)], 1: [(100.0, 100.0)]})
    assert check_one_bucket_overlap(trace) is True
    out = capsys.readouterr().out
    assert out.startswith("Correct! One all-reduce per rank")
    assert "(overlap share: rank 0 0%, rank 1 50%)" in out


@pytest.mark.parametrize(
    "all_reduces, calls",
    [
        ({0: [(60.0, 10.0), (100.0, 10.0), (150.0, 10.0)],
          1: [(60.0, 10.0), (100.0, 10.0), (150.0, 10.0)]}, "{0: 3, 1: 3}"),
        ({0: [(150.0, 10.0)], 1: [(150.0, 10.0), (170.0, 10.0)]}, "{0: 1, 1: 2}"),
        ({0: [(150.0, 10.0)], 1: []}, "{0: 1, 1: 0}"),
        ({0: [], 1: []}, "{0: 0, 1: 0}"),
    ],
)  # fmt: skip
def test_one_bucket_overlap_refuses_any_other_number_of_all_reduces(all_reduces, calls, capsys):
    assert check_one_bucket_overlap(merged(all_reduces)) is False
    out = capsys.readouterr().out
    assert out.startswith(f"Not quite: all-reduces per rank: {calls}.")
    assert "bucket_cap_mb is in MiB" in out


def test_one_bucket_overlap_refuses_an_nccl_trace():
    trace = merged({0: [(150.0, 10.0)], 1: [(150.0, 10.0)]})
    gloo = [e for e in trace["traceEvents"] if e["name"] == "gloo:all_reduce"]
    gloo[0]["name"] = "nccl:all_reduce"
    with pytest.raises(ValueError, match="nccl"):
        check_one_bucket_overlap(trace)


# --- notebook 24: how many buckets DDP built ------------------------------------------------

BUILT = [1_050_628, 2_361_348]  # bytes of each bucket after the rebuild


@pytest.mark.parametrize("answer", [2, np.int64(2), 2.0, torch.tensor(2)])
def test_bucket_count_accepts_the_number_built(answer, capsys):
    assert check_bucket_count(answer, BUILT) is True
    out = capsys.readouterr().out
    assert out.startswith("Correct! DDP built 2 bucket(s): 1,050,628 + 2,361,348 bytes.")


@pytest.mark.parametrize("answer", [1, 3, 25, "2", [2], True, 2.5])
def test_bucket_count_refuses_other_counts(answer, capsys):
    assert check_bucket_count(answer, BUILT) is False
    assert capsys.readouterr().out.startswith(f"Not quite: you said {answer!r}. DDP built 2")


def test_bucket_count_follows_what_was_built_and_waits_for_an_answer(capsys):
    assert check_bucket_count(1, [3_411_976]) is True
    assert check_bucket_count(2, [3_411_976]) is False
    assert check_bucket_count(None, BUILT) is None
    assert NOT_ANSWERED in capsys.readouterr().out


# --- notebook 25: what a restart costs ------------------------------------------------------

# Rank 0's stdout of a job whose rank 1 failed at step 21, 8 steps an epoch, a checkpoint at
# each epoch's end: the last before step 21 was epoch 1's, so attempt 1 trains from epoch 2
# (step 16), and steps 16-20 ran twice.
RESTARTED = SimpleNamespace(stdout=[
    "attempt 0: training from epoch 0 (step 0)\n-- torchrun restarted every rank: attempt 1 --\n"
    "attempt 1: training from epoch 2 (step 16)\n"
])  # fmt: skip


@pytest.mark.parametrize("answer", [(2, 5), [2, 5], (np.int64(2), 5), (2.0, 5.0)])
def test_restart_cost_takes_the_epoch_and_the_steps_done_twice(answer, capsys):
    assert check_restart_cost(RESTARTED, 21, answer) is True
    assert capsys.readouterr().out.startswith("Correct! The last checkpoint before step 21")


@pytest.mark.parametrize("answer", [(1, 5), (2, 21), (2, 4), (2.5, 5), 5, "2, 5", (2, 5, 0)])
def test_restart_cost_refuses_other_pairs(answer, capsys):
    assert check_restart_cost(RESTARTED, 21, answer) is False
    assert capsys.readouterr().out.startswith("Not quite")


def test_restart_cost_asks_for_an_answer_and_says_when_no_restart_happened(capsys):
    assert check_restart_cost(RESTARTED, 21, None) is None
    assert capsys.readouterr().out.startswith(NOT_ANSWERED)
    no_restart = SimpleNamespace(stdout=["attempt 0: training from epoch 0 (step 0)\n"])
    assert check_restart_cost(no_restart, 99, (3, 0)) is False
    assert capsys.readouterr().out.startswith("Not yet: that run made no restart")
