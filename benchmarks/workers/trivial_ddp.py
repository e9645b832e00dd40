"""A trivial DDP job with timestamps: process start, import, init, DDP, one step, teardown."""

import json
import os
import time


def process_start() -> float:
    """When this process started (its fork), to 10 ms: /proc's start time, in clock ticks since
    boot, on the wall clock. (psutil's create_time adds a boot time rounded to the second.)"""
    ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot + ticks / os.sysconf("SC_CLK_TCK")


process_start = process_start()
import torch  # noqa: E402
import torch._dynamo  # noqa: E402, F401  (before init: examples/ddp_train.py says why)
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

imported = time.time()
dist.init_process_group("gloo")
initialized = time.time()
model = DDP(torch.nn.Linear(4, 1))
wrapped = time.time()
model(torch.ones(2, 4)).sum().backward()
stepped = time.time()
if dist.get_rank() == 0:
    marks = dict(process_start=process_start, imported=imported, initialized=initialized,
                 wrapped=wrapped, stepped=stepped)  # fmt: skip
    print("BENCH " + json.dumps(marks), flush=True)
del model  # before the group: docs/upstream.md, sections 1 and 4
dist.destroy_process_group()
