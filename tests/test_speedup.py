"""ddp_kit.speedup on real runs: an epoch timed on a group of the first ranks (2 ranks), and
notebook 17's conclusion for TinyNet on 4 ranks."""

from __future__ import annotations

import pytest
from support import WORKERS

import ddp_kit

WORKER = "speedup.py"


def test_epoch_seconds_times_the_group_and_skips_the_others(run):
    for n in (1, 2):
        for sync in (True, False):
            seconds = run.records[f"speedup/{n}/{sync}"][0]  # [rank]
            assert (seconds[:n] > 0).all() and (seconds[n:] == -1.0).all()


@pytest.mark.torchrun
def test_tinynet_is_slower_on_4_ranks_and_the_all_reduce_is_what_costs():
    """Notebook 17: TinyNet's step is almost all all-reduce latency, so an epoch on 4 ranks
    takes longer than on 1 (1.7x to 5.7x longer in 11 runs on 2 shared cores; 5x in the saved
    notebook), and on 4 ranks the same epoch without the all-reduce (no_sync) takes no longer
    than with it (0.08x to 0.22x in those runs; 10 % of slack for timing noise). On 1 rank the
    difference is only DDP's fixed cost per step (20-30 %), within the noise of shared cores
    (no_sync 2.3x slower in one loaded run): not asserted."""
    run = ddp_kit.launch(WORKERS / "speedup_tinynet.py", nproc=4, output="quiet")
    seconds = {(n, sync): float(run.records[f"tinynet/{n}/{sync}"][0][0])  # rank 0: in both
               for n in (1, 4) for sync in (True, False)}  # fmt: skip
    assert all(s > 0 for s in seconds.values()), seconds
    assert seconds[4, True] > seconds[1, True], seconds
    assert seconds[4, False] <= 1.1 * seconds[4, True], seconds
