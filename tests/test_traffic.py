"""ddp_kit.traffic in the notebook process: the counter patches and restores torch.distributed;
the ring formulas."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from ddp_kit.traffic import CollectiveCounter, ring_bytes_per_rank, uncounted


def test_counter_restores_torch_distributed_and_formulas():
    original = dist.all_reduce
    with CollectiveCounter():
        assert dist.all_reduce is not original
        assert uncounted("all_reduce") is original
    assert dist.all_reduce is original
    assert ring_bytes_per_rank("all_reduce", 100, 4) == 150
    assert ring_bytes_per_rank("reduce_scatter_single", 100, 4) == 75
    assert ring_bytes_per_rank("all_gather_single", 25, 4) == 75
    with pytest.raises(ValueError, match="no ring formula"):
        ring_bytes_per_rank("broadcast", 100, 4)
