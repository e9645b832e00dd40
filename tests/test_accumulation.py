"""Gradient accumulation under no_sync on a real 2-rank run."""

from __future__ import annotations

import numpy as np

WORKER = "accumulation.py"


def test_accumulation_under_no_sync_is_one_batch_with_one_all_reduce(run):
    records = run.records
    one, accumulated = records["accumulation/one_batch"][0], records["accumulation/accumulated"][0]
    assert np.abs(one - accumulated).max() < 1e-6
    assert (accumulated == accumulated[:1]).all()  # synced on every rank
    assert records["accumulation/one_batch_calls"][0, 0] == 1
    assert records["accumulation/accumulated_calls"][0, 0] == 1  # not one per micro-batch
