"""A class rehearses a cluster: two torchrun agents (--nnodes 2) on 127.0.0.1."""

import ddp_kit

CODE = """
import os
import torch
import torch.distributed as dist
from ddp_kit.worker import backend, record

dist.init_process_group(backend())
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
record("where", {"node": int(os.environ["GROUP_RANK"]), "local": int(os.environ["LOCAL_RANK"]),
                 "rank": dist.get_rank(), "world": dist.get_world_size()})
record("total", total)
dist.destroy_process_group()
"""


def test_two_agents_form_one_job_with_global_ranks():
    run = ddp_kit.launch(CODE, nproc=1, nnodes=2, output="quiet")
    assert run.world_size == 2 and len(run.commands) == 2
    assert all("--nnodes=2" in c and "--master-addr=127.0.0.1" in c for c in run.commands)
    where = [run.records.get("where", 0, rank) for rank in range(2)]
    assert where == [
        {"node": 0, "local": 0, "rank": 0, "world": 2},
        {"node": 1, "local": 0, "rank": 1, "world": 2},
    ]
    assert run.records["total"].tolist() == [[[1.0], [1.0]]]
