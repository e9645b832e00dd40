"""A class rehearses a cluster: two torchrun agents (--nnodes 2) on 127.0.0.1."""

import pytest
from support import WORKERS

import ddp_kit

pytestmark = pytest.mark.torchrun


def test_two_agents_form_one_job_with_global_ranks():
    run = ddp_kit.launch(WORKERS / "nodes.py", nproc=1, nnodes=2, output="quiet")
    assert run.world_size == 2 and len(run.commands) == 2
    assert all("--nnodes=2" in c and "--master-addr=127.0.0.1" in c for c in run.commands)
    where = [run.records.get("where", 0, rank) for rank in range(2)]
    assert where == [
        {"node": 0, "local": 0, "rank": 0, "world": 2},
        {"node": 1, "local": 0, "rank": 1, "world": 2},
    ]
    assert run.records["total"].tolist() == [[[1.0], [1.0]]]
