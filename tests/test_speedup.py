"""ddp_kit.speedup on a real 2-rank run: an epoch timed on a group of the first ranks."""

from __future__ import annotations

WORKER = "speedup.py"


def test_epoch_seconds_times_the_group_and_skips_the_others(run):
    for n in (1, 2):
        for sync in (True, False):
            seconds = run.records[f"speedup/{n}/{sync}"][0]  # [rank]
            assert (seconds[:n] > 0).all() and (seconds[n:] == -1.0).all()
