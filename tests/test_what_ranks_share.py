"""Notebook 26's claims about DataLoader workers and waits, on real runs: workers forked inside
ranks (the fast start forks the ranks themselves) and in plainly started ranks; a barrier that
times out under a long evaluation; a barrier with a timeout of its own, or in a group of its
own, that waits; monitored_barrier's timeout, which does not lengthen the other ranks' wait."""

from __future__ import annotations

import pytest

import ddp_kit

pytestmark = pytest.mark.torchrun

WORKERS = """
import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler, get_worker_info
from ddp_kit.worker import backend, record

class Shifted(Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, index):
        worker = get_worker_info()
        return torch.tensor([index, worker.id, worker.seed, np.random.randint(1000)])

def augmented(generator=None):
    data = Shifted()
    loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, shuffle=False),
                        num_workers=2, generator=generator)
    return torch.cat(list(loader))

dist.init_process_group(backend())
torch.manual_seed(0)
record("classic", augmented())
record("fixed", augmented(torch.Generator().manual_seed(1234 + dist.get_rank())))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("start", ["fast", "plain"])
def test_loader_workers_share_seeds_across_ranks_exactly_when_the_ranks_do(start):
    env = {"DDP_KIT_FAST_START": "0"} if start == "plain" else None
    run = ddp_kit.launch(WORKERS, nproc=2, env=env, output="quiet")
    classic, fixed = run.records["classic"][0], run.records["fixed"][0]  # [rank, row, column]
    for rows in (classic, fixed):  # two workers on each rank, each with its own seed
        assert all(set(rows[r][:, 1].tolist()) == {0, 1} for r in range(2))
        assert all(len(set(rows[r][:, 2].tolist())) == 2 for r in range(2))
    assert set(classic[0][:, 2].tolist()) == set(classic[1][:, 2].tolist())
    assert (classic[0][:, 3] == classic[1][:, 3]).all()  # the same shift for each pair of samples
    assert not set(fixed[0][:, 2].tolist()) & set(fixed[1][:, 2].tolist())


EVALUATION = """
import time
from datetime import timedelta
import torch.distributed as dist
from ddp_kit.worker import backend, record
dist.init_process_group(backend())
patient = dist.new_group(timeout=timedelta(seconds=10))
if dist.get_rank() == 0:
    time.sleep(4)
start = time.monotonic()
try:
    WAIT
finally:
    record("waited", time.monotonic() - start)
dist.destroy_process_group()
"""


@pytest.mark.parametrize(
    ("wait", "ends"),
    [
        ("dist.barrier()", "Timed out waiting 2000ms"),
        ("dist.monitored_barrier(timeout=timedelta(seconds=10))", "Timed out waiting 2000ms"),
        ("dist.barrier(group=patient)", None),
        ("dist.barrier(timeout=timedelta(seconds=10))", None),
    ],
)
def test_a_wait_for_a_4_s_evaluation_lasts_as_long_as_its_group_allows(wait, ends):
    run = ddp_kit.launch(EVALUATION.replace("WAIT", wait), nproc=2, collective_timeout=2,
                         output="quiet", check=False)  # fmt: skip
    waited = float(run.records.get("waited", step=0, rank=1))
    if ends is None:  # a 10 s timeout of its own: rank 1 waits for rank 0's evaluation
        assert run.ok and 3.5 < waited < 10
    else:  # the default group's 2 s, whatever monitored_barrier's own timeout says
        (failure,) = [f for f in run.failures if f.rank == 1]
        assert ends in failure.message and 1.5 < waited < 4 and not run.ok
