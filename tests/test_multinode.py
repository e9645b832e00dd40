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


def test_a_failed_node_makes_the_kit_stop_the_other_soon_not_after_torchruns_barrier():
    # rank 1 (node 1) raises; rank 0 (node 0) finishes: torchrun would keep node 0's agent in
    # its exit barrier for 300 s, waiting for node 1's
    code = "from ddp_kit.worker import rank\nif rank() == 1:\n    raise ValueError('on purpose')\n"
    run = ddp_kit.launch(code, nproc=1, nnodes=2, output="quiet", check=False)
    assert [f.rank for f in run.failures] == [1] and run.completed == [0]
    assert run.duration < 60
    assert run.notes == [
        "Node 1's agent ended first, with exit code 1: the job had failed, so the kit stopped the "
        "other agents 5 s later (torchrun would keep them waiting for it)."
    ]
