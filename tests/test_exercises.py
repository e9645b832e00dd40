"""The notebooks' check functions accept right answers, reject wrong ones, wait for None."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ddp_kit import exercises
from ddp_kit.shared.records import Records
from ddp_kit.toy import make_dataset, make_model


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
        (exercises.check_linear_lr, (0.1, 8), 0.8, 0.1),
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
    ],
)
def test_answers_of_other_types(check, args, answer, verdict, capsys):
    """numpy and tensor answers count when right; ints are not bools and bools not numbers;
    an answer of the wrong kind is a wrong answer, never a crash."""
    assert check(*args, answer) is verdict
    assert capsys.readouterr().out.startswith("Correct!" if verdict else "Not quite")


def records_of(per_rank: list[dict]) -> Records:
    """Records as ranks would have written them: {name: {step: value}} per rank."""
    return Records([{name: {0: value} for name, value in rank.items()} for rank in per_rank])


def test_edit_and_run_checks(capsys):
    """The checks that read what a student's edited cell produced: right, then wrong."""
    big = np.array([1.0, -2.0])
    assert exercises.check_accumulation(big, big, 1, 1) is True
    assert exercises.check_accumulation(big, big, 4, 1) is False
    assert exercises.check_accumulation(2 * big, big, 1, 1) is False
    assert exercises.check_hand_average([big] * 4, big) is True
    assert exercises.check_hand_average([4 * big] * 4, big) is False
    assert "rank 0: 4.00 x DDP's" in capsys.readouterr().out
    # divided on rank 0 only (or dist.reduce to rank 0): the other ranks hold the sum
    assert exercises.check_hand_average([big, 4 * big, 4 * big, 4 * big], big) is False
    assert "rank 0" not in (said := capsys.readouterr().out) and "rank 3: 4.00" in said
    assert exercises.check_no_repeats([[0, 1], [2, 3]], size=5, ranks=2) is True
    assert exercises.check_no_repeats([[0, 1, 2], [3, 0, 4]], size=5, ranks=2) is False
    assert exercises.check_no_repeats([[0, 1, 2], [3, 4]], size=5, ranks=2) is False


def test_the_shard_and_no_repeats_checks_judge_what_the_review_found(capsys):
    """The right set in any order is right; parts that leave out too much, or come from a
    smaller dataset, are not (notebooks-review-3a, C1 and C2)."""
    assert exercises.check_shard(10, 4, 2, [0, 2, 6]) is True
    assert exercises.check_shard(10, 4, 2, {0, 2, 6}) is True
    assert "In the sampler's order: [2, 6, 0]" in capsys.readouterr().out
    assert exercises.check_shard(10, 4, 2, [0, 2, 2]) is False
    from torch.utils.data.distributed import DistributedSampler

    def parts(size, ranks=range(4), **options):
        return [list(DistributedSampler(range(size), num_replicas=4, rank=r, shuffle=True,
                                        seed=0, **options)) for r in ranks]  # fmt: skip

    def check(parts, drop_last=False):
        options = dict(shuffle=True, seed=0, **({"drop_last": True} if drop_last else {}))
        return exercises.check_no_repeats(parts, size=18, options=options)

    assert check(parts(18, drop_last=True), drop_last=True) is True
    assert check(parts(18)) is False  # 2 repeated
    assert check(parts(18, ranks=range(2))) is False  # 2 of the 4 samplers
    assert "2 parts, not one for each of the 4 ranks" in capsys.readouterr().out
    assert check(parts(16)) is False  # a smaller dataset: 2 left out, as drop_last would
    assert "not the parts DistributedSampler gives" in capsys.readouterr().out


def test_the_ring_check_reads_the_tensor_and_only_shows_the_bytes(capsys):
    sums = np.arange(8.0).reshape(2, 4)  # [rank, number]
    assert exercises.check_ring(sums, sums, [48, 48], 48) is True
    assert "each rank sent 48 bytes" in capsys.readouterr().out
    assert exercises.check_ring(sums, sums, [40, 48], 48) is True  # bytes are not judged
    halves = sums.copy()
    halves[1, :2] = 0  # a chunk never copied into the tensor (`chunks[i] = received`)
    assert exercises.check_ring(halves, sums, [48, 48], 48) is False
    assert "1 rank(s) do not hold the sum" in capsys.readouterr().out


def test_the_own_ddp_check_wants_asynchronous_all_reduces_started_during_backward(capsys):
    grads = np.ones((3, 2, 5))  # [step, rank, number]

    def records(launched, asynchronous=True, calls=2, waited=3.0):
        buckets = [{"launched": t, "finished": t + 0.1, "async": asynchronous, "waited": waited}
                   for t in launched]  # fmt: skip
        step = {"buckets": buckets, "ready": {"w": 1.0, "b": 2.0}}
        per_rank = [{"mine/grad": dict(enumerate(grads[:, r])), "ddp/grad": dict(enumerate(
            grads[:, r])), "mine/calls": {0: calls}, "mine/buckets": {0: step}} for r in range(2)]
        return Records(per_rank)

    assert exercises.check_own_ddp(records([1.0, 2.0]), "mine", "ddp") is True
    assert exercises.check_own_ddp(records([1.0, 2.0], asynchronous=False), "mine", "ddp") is False
    assert "2 all-reduce(s) blocked backward" in capsys.readouterr().out
    # async_op=True, but wait() right away in the hook, before the last gradient was ready
    assert exercises.check_own_ddp(records([1.0, 2.0], waited=1.5), "mine", "ddp") is False
    assert exercises.check_own_ddp(records([2.5, 2.6]), "mine", "ddp") is False  # after backward
    assert exercises.check_own_ddp(records([1.0, 2.0], calls=1), "mine", "ddp") is False
    before = {"all_gather_single": 200, "reduce_scatter_single": 400}
    assert exercises.check_fewer_gathers({**before, "all_gather_single": 100}, before) is True
    assert exercises.check_fewer_gathers(before, before) is False
    assert exercises.check_two_byte_gradients(["float16"], "torch.float32") is True
    assert exercises.check_two_byte_gradients(["float32"], "torch.float32") is False
    assert exercises.check_two_byte_gradients([], "torch.float32") is False
    assert exercises.check_two_byte_gradients(["bfloat16"], "torch.bfloat16") is False
    capsys.readouterr()


def ranks_holding(**variables: list) -> SimpleNamespace:
    """A stand-in for a live session whose ranks hold `variables` (one value per rank)."""
    return SimpleNamespace(pull=lambda name: variables[name])


def test_checks_that_read_records(capsys):
    join = [{"mine/last_factor": f} for f in (0.0, 1.0)]
    assert exercises.check_join_division(records_of(join)) is True
    join[1]["mine/last_factor"] = 0.5
    assert exercises.check_join_division(records_of(join)) is False
    rerun = Records(
        [{"mine/last_factor": {0: 0.0, 1: 0.0}}, {"mine/last_factor": {0: 0.25, 1: 1.0}}]
    )
    assert exercises.check_join_division(rerun) is True  # the latest run counts
    assert exercises.check_join_division(records_of([{}, {}])) is None
    fixed = ranks_holding(error=[None, None], grad=[np.array([1.0, 2.0])] * 2)
    assert exercises.check_unused_fix(fixed) is True
    unsynced = ranks_holding(error=[None, None], grad=[np.array([1.0, 2.0]), np.array([3.0, 2.0])])
    assert exercises.check_unused_fix(unsynced) is False
    failed = ranks_holding(error=["Expected to have finished"] * 2, grad=[None, None])
    assert exercises.check_unused_fix(failed) is False
    x, y = make_dataset(17).tensors
    with torch.no_grad():
        truth = torch.nn.functional.mse_loss(make_model()(x), y).item()
    right = SimpleNamespace(records=records_of([{"yours": truth}] * 2))
    assert exercises.check_global_eval(right, 17) is True
    wrong = SimpleNamespace(records=records_of([{"yours": truth * 0.9}] * 2))
    assert exercises.check_global_eval(wrong, 17) is False
    capsys.readouterr()


def test_hook_budget_reads_the_last_steps():
    def run(sent: int, loss: float) -> Records:
        steps = {"mine/sent": {s: sent for s in range(8)}, "mine/loss": {s: loss for s in range(8)}}
        return Records([steps, steps])

    assert exercises.check_hook_budget(None, 1000, 1.0) is None
    assert exercises.check_hook_budget(run(250, 1.05), 1000, 1.0) is True
    assert exercises.check_hook_budget(run(300, 1.05), 1000, 1.0) is False
    assert exercises.check_hook_budget(run(250, 1.2), 1000, 1.0) is False
