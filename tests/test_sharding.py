"""ZeRO and FSDP2 beside DDP on real runs at 2 and 4 ranks: what each rank holds, what is sent,
and the same weights after the same Adam steps."""

from __future__ import annotations

import numpy as np

WORKER = "sharding.py"
RANKS = [2, 4]


def test_zero_shards_optimizer_state_about_one_nth(run):
    records, world = run.records, run.world_size
    ddp_state = records["DDP/state_bytes"][0]
    zero_state = records["ZeRO/state_bytes"][0]
    assert (ddp_state == ddp_state[0]).all()
    # whole parameters are dealt out, so the shares are close to, not exactly, 1/N
    assert zero_state.max() <= 1.25 * ddp_state[0] / world
    # each parameter's state (exp_avg, exp_avg_sq, step) lives on exactly one rank
    assert zero_state.sum() == ddp_state[0]


def test_ddp_buckets_hold_a_second_copy_of_the_gradients(run):
    model_bytes = 14657 * 4  # 58,628
    for kind in ["DDP", "ZeRO"]:
        assert (run.records[f"{kind}/bucket_bytes"][0] == model_bytes).all(), kind
    assert (run.records["view/grad_storages"][0] == 1).all()  # gradient_as_bucket_view=True


def test_fsdp2_shards_parameters_and_optimizer_state(run):
    records, world = run.records, run.world_size
    ddp_params = records["DDP/param_bytes"][0, 0]
    fsdp_params = records["FSDP2/param_bytes"][0]
    assert fsdp_params.max() <= ddp_params / world + 65 * 4  # + the unsplittable 1-row layer
    assert records["FSDP2/state_bytes"][0].max() <= 2 * fsdp_params.max() + 40


def test_zero_and_fsdp2_end_with_ddps_weights(run):
    records = run.records
    ddp = records["DDP/weights"][0]
    assert (ddp == ddp[:1]).all()
    assert np.array_equal(records["ZeRO/weights"][0], ddp)
    assert np.abs(records["FSDP2/weights"][0] - ddp).max() < 1e-6


def test_what_each_method_sends(run):
    records = run.records
    sent = {kind: records.get(f"{kind}/sent", 0, 0) for kind in ["DDP", "ZeRO", "FSDP2"]}
    model_bytes = 14657 * 4
    assert sent["DDP"] == {"all_reduce": model_bytes}
    assert sent["ZeRO"] == {"all_reduce": model_bytes, "broadcast": model_bytes}
    assert set(sent["FSDP2"]) == {"all_gather_single", "reduce_scatter_single"}
    padded = sent["FSDP2"]["reduce_scatter_single"]
    assert model_bytes <= padded < model_bytes * 1.05
    assert sent["FSDP2"]["all_gather_single"] * run.world_size == 2 * padded
