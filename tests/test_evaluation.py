"""Distributed evaluation with DistributedSampler's padding, on real runs at 2 and 4 ranks."""

from __future__ import annotations

import numpy as np

WORKER = "evaluation.py"
RANKS = [2, 4]


def test_global_eval_mean_leaves_the_padding_out(run):
    records, world = run.records, run.world_size
    masked = records["eval/masked_mean"][0]
    assert np.allclose(masked, 8.0)  # the mean of 0..16
    padded = records["eval/padded_mean"][0]
    repeats = -17 % world
    assert np.allclose(padded, (136 + sum(range(repeats))) / (17 + repeats))
