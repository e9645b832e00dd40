"""Notebook 27's claims about torch.compile and DDP, on real runs in both starts (forked ranks,
whose fork server imported torch._dynamo, and plainly started ones): the graph breaks in DDP's
forward, DDPOptimizer's cut at bucket boundaries, the nn.Sequential that is not compiled, the
refused small buckets, and which way of setting a TORCHDYNAMO_ variable reaches dynamo.

Inductor itself (the compile's cost, the weights against eager's) is asserted in the notebook's
own cells, which nbval runs: a cold compile costs 10-20 s of both cores."""

from __future__ import annotations

import pytest

import ddp_kit

pytestmark = pytest.mark.torchrun

PLAIN = {"DDP_KIT_FAST_START": "0"}

COMPILE = """
import re
import torch
import torch._dynamo
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from ddp_kit.worker import backend, record

dist.init_process_group(backend())
torch.manual_seed(dist.get_rank())
x, y = torch.randn(64, 512), torch.randn(64, 1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(512, 512) for _ in range(4))
        self.head = nn.Linear(512, 1)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def stacked():
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(512, 512), nn.ReLU())],
                         nn.Linear(512, 1))


graphs = []


def counting(gm, example_inputs):
    graphs.append(sum(n.op.startswith("call_") for n in gm.graph.nodes))
    return gm.forward


def report(model):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    graphs.clear()
    nn.functional.mse_loss(model(x), y).backward()
    reasons = torch._dynamo.utils.counters["graph_break"]
    names = {re.findall(r"`([\\w.]+)`", r.split("Explanation:")[1].splitlines()[0])[0]: n
             for r, n in reasons.items()}
    return {"breaks": names, "graphs": list(graphs)}


outside = lambda module=Net, **o: torch.compile(DDP(module(), **o), backend=counting)
record("outside", report(outside(bucket_cap_mb=1)))
record("inside", report(DDP(torch.compile(Net(), backend=counting), bucket_cap_mb=1)))
record("sequential", report(outside(stacked, bucket_cap_mb=1)))
record("three", report(outside(bucket_cap_mb=2)))
record("default", report(outside()))
eager = DDP(Net(), bucket_cap_mb=1)
for _ in range(3):   # DDP rebuilds its buckets after the first step
    nn.functional.mse_loss(eager(x), y).backward()
record("eager_buckets", len(eager._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(",")))
torch._dynamo.config.optimize_ddp = False
record("whole", report(outside(bucket_cap_mb=1)))
torch._dynamo.config.optimize_ddp = True
try:
    report(outside(bucket_cap_mb=0.25))
    record("small", "compiled")
except Exception as error:
    record("small", f"{type(error).__name__}: {error}")
dist.destroy_process_group()
"""

DDP_BREAKS = {"set_runtime_stats_and_log": 1, "DistributedDataParallel._inside_ddp_forward": 2}


@pytest.mark.parametrize("start", ["fast", "plain"])
def test_dynamo_breaks_ddp_forward_twice_and_cuts_the_model_at_bucket_boundaries(start):
    run = ddp_kit.launch(COMPILE, nproc=2, output="quiet", env=PLAIN if start == "plain" else None)
    assert run.ok
    for rank in range(2):
        names = ("outside", "inside", "sequential", "three", "default", "whole", "small",
                 "eager_buckets")
        seen = {name: run.records.get(name, 0, rank) for name in names}
        assert seen["outside"] == {"breaks": DDP_BREAKS, "graphs": [2, 2, 2, 3]}
        assert seen["inside"] == {"breaks": {}, "graphs": [2, 2, 2, 3]}
        assert seen["sequential"] == {"breaks": DDP_BREAKS, "graphs": []}  # torch/nn is skipped
        assert seen["three"]["graphs"] == [2, 4, 3]  # the exercise's answer: 2 MiB, 3 pieces
        assert seen["default"]["graphs"] == [6, 3]  # 25 MiB: the first piece still ends at 1 MiB
        assert seen["whole"]["graphs"] == [9]  # optimize_ddp=False: one graph
        assert seen["eager_buckets"] == 4  # compiled: 5 (the notebook's output, under nbval)
        assert seen["small"].startswith(
            "AssertionError: First bucket should be smaller/equal to other buckets"
        )


VERBOSE = """
import os
import torch
import psutil
from ddp_kit.worker import record

record("forked", "ddp_kit.rank.forkserver" in " ".join(psutil.Process().cmdline()))
os.environ["TORCHDYNAMO_VERBOSE"] = os.environ.get("SET_IN_SCRIPT", "0")
import torch._dynamo

record("verbose", torch._dynamo.config.verbose)
"""


@pytest.mark.parametrize(
    ("start", "env", "reached"),
    [
        ("fast", {"SET_IN_SCRIPT": "1"}, False),  # the fork server imported torch._dynamo first
        ("plain", {"SET_IN_SCRIPT": "1"}, True),  # imported here, after the script set it
        ("fast", {"TORCHDYNAMO_VERBOSE": "1", "SET_IN_SCRIPT": "1"}, True),  # given to the launch
    ],
)
def test_a_torchdynamo_variable_reaches_dynamo_when_the_launch_is_given_it(start, env, reached):
    env = {**env, **(PLAIN if start == "plain" else {})}
    run = ddp_kit.launch(VERBOSE, nproc=2, output="quiet", env=env)
    assert run.ok
    assert [run.records.get("verbose", 0, rank) for rank in range(2)] == [reached] * 2
    assert [run.records.get("forked", 0, rank) for rank in range(2)] == [start == "fast"] * 2
