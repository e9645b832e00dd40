"""The notebooks' check functions accept right answers, reject wrong ones, wait for None."""

import numpy as np
import pytest
import torch

from ddp_kit import exercises


@pytest.mark.parametrize(
    ("check", "args", "right", "wrong"),
    [
        (exercises.check_rank_sum, (3,), 3, 6),
        (exercises.check_batch_count, (18, 4), 5, 4),
        (exercises.check_shard, (10, 4, 2), [2, 6, 0], [2, 6]),
        (exercises.check_parameter_count, (), 19, 16),
        (exercises.check_broadcast_source, (), 0, 1),
        (exercises.check_backend, (4, 2), "gloo", "nccl"),
        (exercises.check_global_batch, (2, 4), 8, 2),
        (exercises.check_average, ([0.5, -1.0, 2.0, 0.5],), 0.5, 2.0),
        (exercises.check_ring_traffic, (100, 4), 150.0, 100.0),
        (exercises.check_copies_identical, (), True, False),
        (exercises.check_linear_lr, (0.1, 8), 0.8, 0.1),
        (exercises.check_epoch_fix, (), "sampler.set_epoch(epoch)", "shuffle=True"),
    ],
)
def test_checks(check, args, right, wrong, capsys):
    assert check(*args, None) is None
    assert "Not answered yet" in capsys.readouterr().out
    assert check(*args, right) is True
    assert capsys.readouterr().out.startswith("Correct!")
    assert check(*args, wrong) is False
    assert capsys.readouterr().out.startswith("Not quite")


@pytest.mark.parametrize(
    ("check", "args", "answer", "verdict"),
    [
        (exercises.check_average, ([0.5, -1.0, 2.0, 0.5],), np.float32(0.5), True),
        (exercises.check_average, ([0.5, -1.0, 2.0, 0.5],), torch.tensor(0.5), True),
        (exercises.check_average, ([0.5, -1.0, 2.0, 0.5],), "0.5", False),
        (exercises.check_parameter_count, (), np.int64(19), True),
        (exercises.check_parameter_count, (), torch.tensor([19]), True),
        (exercises.check_broadcast_source, (), False, False),
        (exercises.check_rank_sum, (2,), True, False),
        (exercises.check_shard, (10, 4, 2), 2, False),
        (exercises.check_shard, (10, 4, 2), np.array([2, 6, 0]), True),
        (exercises.check_shard, (10, 4, 2), torch.tensor([2, 6, 0]), True),
        (exercises.check_copies_identical, (), 1, False),
        (exercises.check_copies_identical, (), np.bool_(True), True),
    ],
)
def test_answers_of_other_types(check, args, answer, verdict, capsys):
    """numpy and tensor answers count when right; ints are not bools and bools not numbers;
    an answer of the wrong kind is a wrong answer, never a crash."""
    assert check(*args, answer) is verdict
    assert capsys.readouterr().out.startswith("Correct!" if verdict else "Not quite")
