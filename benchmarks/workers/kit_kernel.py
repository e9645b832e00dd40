"""A kernel for the benchmark: a fresh Python process that uses the kit as a notebook does, so
that the benchmark can give it the start-up switch and count the CPU time of its whole tree.

    kit_kernel.py NPROC JOBS     JOBS one-shot trivial DDP jobs, then a live session until its
                                 DDP model is built; prints one JSON line of wall times

The fork server (if any) ends with this process and is waited for, so the parent's
RUSAGE_CHILDREN counts every process of the tree.
"""

import json
import sys
import time
from pathlib import Path

import ddp_kit
from ddp_kit.kernel import fast_start

TRIVIAL_DDP = Path(__file__).resolve().parent / "trivial_ddp.py"
DDP_READY = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from ddp_kit.worker import backend
dist.init_process_group(backend())
model = DDP(torch.nn.Linear(4, 1))
"""

nproc, jobs = int(sys.argv[1]), int(sys.argv[2])
walls = []
for _ in range(jobs):
    start = time.perf_counter()
    ddp_kit.launch(TRIVIAL_DDP, nproc, output="quiet")
    walls.append(time.perf_counter() - start)
start = time.perf_counter()
with ddp_kit.Session(nproc, output="quiet") as session:
    session.run(DDP_READY)
    ready = time.perf_counter() - start
    session.run("del model\ndist.destroy_process_group()")
server = fast_start.current()
memory = server.memory() if server is not None else None
print("BENCH " + json.dumps({"jobs_s": walls, "session_ready_s": ready, "server": memory}))
