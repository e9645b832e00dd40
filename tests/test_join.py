"""Uneven inputs under Join on real runs at 2 and 4 ranks."""

from __future__ import annotations

import numpy as np
import pytest
from support import WORKERS

import ddp_kit

pytestmark = pytest.mark.torchrun


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def run(request):
    return ddp_kit.launch(WORKERS / "join.py", nproc=request.param, output="quiet")


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
