"""ddp_kit.speedup on a real 2-rank run: an epoch timed on a group of the first ranks."""

from __future__ import annotations

import pytest
from support import WORKERS

import ddp_kit

pytestmark = pytest.mark.torchrun


@pytest.fixture(scope="module")
def run():
    return ddp_kit.launch(WORKERS / "speedup.py", nproc=2, output="quiet")


def test_epoch_seconds_times_the_group_and_skips_the_others(run):
    for n in (1, 2):
        for sync in (True, False):
            seconds = run.records[f"speedup/{n}/{sync}"][0]  # [rank]
            assert (seconds[:n] > 0).all() and (seconds[n:] == -1.0).all()
