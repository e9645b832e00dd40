"""A trivial DDP job with timestamps: process start, import, init, DDP, one step, teardown."""

import json
import time

import psutil

process_start = psutil.Process().create_time()
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
