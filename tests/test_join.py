"""Uneven inputs under Join on real runs at 2 and 4 ranks."""

from __future__ import annotations

import numpy as np

WORKER = "join.py"
RANKS = [2, 4]


def test_join_shadows_with_zeros_and_divides_by_the_initial_world(run):
    records, world = run.records, run.world_size
    local = records["join/grad_local"]  # [round, rank, weight]
    assert local.shape[0] == 2 + world - 1  # as many rounds as the busiest rank's batches
    for rank in range(world):
        trained = (np.abs(local[:, rank]).sum(axis=1) > 0).tolist()
        assert trained == [r < 2 + rank for r in range(local.shape[0])], rank
    last = local.shape[0] - 1
    synced = records["join/grad_synced"][last]
    assert np.abs(synced - local[last, world - 1] / world).max() < 1e-7


def test_without_a_hook_ddp_divides_by_the_initial_world_unless_told_otherwise(run):
    last = run.world_size - 1  # the busiest rank: alone in the last round
    default = run.records["no_hook/divide_True/last_factor"][0, last]
    assert abs(default - 1 / run.world_size) < 1e-5
    assert abs(run.records["no_hook/divide_False/last_factor"][0, last] - 1) < 1e-5
