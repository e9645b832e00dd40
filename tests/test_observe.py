"""A real DDP run on 2 and 4 ranks, checked against the maths of data parallelism."""

from __future__ import annotations

import numpy as np
import pytest
from support import WORKERS

import ddp_kit
from ddp_kit.reference import global_batches, single_process_run
from ddp_kit.toy import make_dataset, make_model

DATASET_SIZE = 18  # not a multiple of 4: the sampler pads by repeating samples
BATCH = 2  # per rank
STEPS = 3
LR = 0.1

WORKER = "observe.py"
RANKS = [2, 4]
WORKER_ARGS = [DATASET_SIZE, BATCH, STEPS, LR]


def test_sampler_shards_are_disjoint_cover_and_show_padding(run):
    world = run.world_size
    shards = run.records["shard"]  # [epoch, rank, i]
    per_rank = -(-DATASET_SIZE // world)  # ceil
    assert shards.shape == (2, world, per_rank)
    for epoch in range(2):
        flat = shards[epoch].reshape(-1)
        assert set(flat.tolist()) == set(range(DATASET_SIZE))  # covers the dataset
        padding = world * per_rank - DATASET_SIZE
        order = shards[epoch].T.reshape(-1)  # the shuffled list, as the sampler strides it
        assert order[DATASET_SIZE:].tolist() == order[:padding].tolist()  # repeats the start
    assert shards[0].tolist() != shards[1].tolist()  # set_epoch reshuffles
    dropped = run.records["shard_drop_last"][0]
    assert len(set(dropped.reshape(-1).tolist())) == dropped.size  # disjoint, nothing repeated
    assert dropped.size == DATASET_SIZE // world * world


def test_ddp_broadcasts_rank0_weights(run):
    before = run.records["checksum_before"][0]
    after = run.records["checksum_after"][0]
    assert len(set(before.tolist())) == run.world_size  # seeded differently on purpose
    assert after.tolist() == [before[0]] * run.world_size


def test_each_rank_gets_its_own_batch(run):
    data = make_dataset(DATASET_SIZE)
    for step in range(STEPS):
        for rank in range(run.world_size):
            batch = run.records.get("batch", step, rank).tolist()
            np.testing.assert_array_equal(run.records.get("x", step, rank), data[batch][0])


def test_synced_gradient_is_the_mean_of_local_gradients(run):
    local, synced = run.records["grad_local"], run.records["grad_synced"]
    assert local.shape == (STEPS, run.world_size, 19)
    assert not np.allclose(local[:, 0], local[:, 1])  # different data, different gradients
    mean = local.mean(axis=1)
    for rank in range(run.world_size):
        np.testing.assert_allclose(synced[:, rank], mean, rtol=1e-5, atol=1e-7)


def test_synced_gradient_equals_single_process_full_batch_gradient(run):
    ranks = range(run.world_size)
    batches = [[run.records.get("batch", s, r) for s in range(STEPS)] for r in ranks]
    grads, weights, _ = single_process_run(
        make_model(seed=0), make_dataset(DATASET_SIZE), global_batches(batches), lr=LR
    )
    for step in range(STEPS):
        for rank in range(run.world_size):
            np.testing.assert_allclose(
                run.records["grad_synced"][step, rank], grads[step].numpy(), rtol=1e-5, atol=1e-6
            )
            np.testing.assert_allclose(
                run.records["weights"][step, rank], weights[step].numpy(), rtol=1e-5, atol=1e-6
            )


def test_weights_are_bit_identical_across_ranks_after_every_step(run):
    weights = run.records["weights"]
    for rank in range(1, run.world_size):
        assert np.array_equal(weights[:, rank], weights[:, 0])


def test_from_scratch_data_parallel_matches_torch_ddp(run):
    np.testing.assert_allclose(
        run.records["scratch_weights"], run.records["weights"], rtol=1e-5, atol=1e-6
    )


def test_skipping_sync_makes_the_copies_diverge(run):
    unsynced = run.records["unsynced_weights"]
    assert np.abs(unsynced[-1] - unsynced[-1, 0]).max() > 1e-3


def test_buckets_one_at_first_then_rebuilt_in_backward_order(run):
    first = run.records.get("buckets", 0, 0)["buckets"]
    assert len(first) == 1 and sum(b["numel"] for b in first) == 19
    later = run.records.get("buckets", STEPS - 1, 0)["buckets"]
    assert len(later) > 1 and sum(b["numel"] for b in later) == 19
    assert later[0]["params"][0] == "out.bias"  # the last layer's gradients are ready first
    assert all(b["finished"] >= b["launched"] for b in later)


@pytest.mark.torchrun
def test_bucket_limits_25_mib_and_a_1_mib_first_bucket_after_the_rebuild():
    run = ddp_kit.launch(WORKERS / "buckets.py", nproc=2, output="quiet")
    records, mib, layer = run.records, 2**20, (256 * 256 + 256) * 4
    assert records["default/bucket_bytes_cap"][0, 0] == 25 * mib
    first = records.get("default/buckets", 0, 0)["buckets"]
    assert [b["numel"] * 4 for b in first] == [6 * layer]  # iteration 0: one bucket
    rebuilt = [b["numel"] * 4 for b in records.get("default/buckets", 2, 0)["buckets"]]
    assert rebuilt == [4 * layer, 2 * layer]  # the first bucket closes once it reaches 1 MiB
    assert rebuilt[0] >= mib > rebuilt[0] - 256 * 256 * 4
    explicit = records.get("explicit/buckets", 2, 0)["buckets"]  # bucket_cap_mb=25 given
    assert [b["numel"] * 4 for b in explicit] == [6 * layer]


@pytest.mark.torchrun
def test_recorder_alone_saves_a_single_step_at_exit():
    code = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from ddp_kit.observe import GradientRecorder
from ddp_kit.toy import make_model
from ddp_kit.worker import backend

dist.init_process_group(backend())
model = DDP(make_model())
GradientRecorder(model)  # nothing else is recorded, and only one step runs
model(torch.ones(2, 4)).sum().backward()
dist.destroy_process_group()
"""
    run = ddp_kit.launch(code, nproc=1, output="quiet")
    assert run.records["grad_synced"].shape == (1, 1, 19)
