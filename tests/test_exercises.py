"""The notebooks' check functions accept right answers, reject wrong ones, wait for None."""

import pytest

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
