"""`python hosts_kernel.py HOST1 HOST2 REPEATS SIZE...`: the benchmark's kernel for a launch over
hosts (bench.across_hosts), run where ssh reaches both hosts. Interleaved, REPEATS times: the
trivial DDP job on 2 hosts x 2 ranks, and the same 4 ranks on HOST1 alone (one agent, started
over ssh too). Then gloo all-reduce times of each SIZE (bytes): one rank on each host (across
the link between them) and 2 ranks on HOST1. Then a DDP step as a live session's cell, the
median of CELLS cells, on the same two placements. One line: BENCH {json}."""

import json
import statistics
import sys
import time
from pathlib import Path

import ddp_kit

WORKERS = Path(__file__).resolve().parent


def job(script: str, nproc: int, hosts: list[str], args: list[str] = ()) -> tuple[float, str]:
    """Seconds of one launch over ssh, and rank 0's stdout."""
    start = time.perf_counter()
    run = ddp_kit.launch(WORKERS / script, nproc, hosts=hosts, launcher="ssh", output="quiet",
                         args=list(args))  # fmt: skip
    return time.perf_counter() - start, run.stdout[0]


STEP_SETUP = """
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from ddp_kit.worker import backend
dist.init_process_group(backend())
torch.manual_seed(0)
model = DDP(nn.Linear(64, 64))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
"""
STEP = "optimizer.zero_grad()\nmodel(x).sum().backward()\noptimizer.step()\n"
CELLS = 5


def step_cell_seconds(nproc: int, hosts: list[str]) -> float:
    """The median wall time of a DDP step run as a cell of live ranks on `hosts` (after one
    step that builds DDP's buckets)."""
    with ddp_kit.Session(nproc, hosts=hosts, launcher="ssh", output="quiet") as session:
        session.run(STEP_SETUP)
        session.run(STEP)
        times = []
        for _ in range(CELLS):
            start = time.perf_counter()
            session.run(STEP)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def seconds_per_size(stdout: str) -> list[float]:
    line = next(x for x in stdout.splitlines() if x.startswith("BENCH "))
    return json.loads(line[len("BENCH ") :])["seconds"]


def main() -> None:
    first, second, repeats, *sizes = sys.argv[1:]
    out = {"two_hosts_s": [], "one_host_s": []}
    for _ in range(int(repeats)):
        out["two_hosts_s"].append(job("trivial_ddp.py", 2, [first, second])[0])
        out["one_host_s"].append(job("trivial_ddp.py", 4, [first])[0])
    out["across_s"] = seconds_per_size(job("allreduce.py", 1, [first, second], sizes)[1])
    out["within_s"] = seconds_per_size(job("allreduce.py", 2, [first], sizes)[1])
    out["two_hosts_step_s"] = step_cell_seconds(2, [first, second])
    out["one_host_step_s"] = step_cell_seconds(4, [first])
    print("BENCH " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
