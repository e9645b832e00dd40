"""Steps per second of TinyNet under DDP; arguments: per-rank batch, steps."""

import json
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.toy import make_model

dist.init_process_group("gloo")
batch, steps = (int(v) for v in sys.argv[1:])
model = DDP(make_model())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(batch, 4), torch.randn(batch, 1)


def step() -> None:
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


for _ in range(5):
    step()
dist.barrier()
start = time.perf_counter()
for _ in range(steps):
    step()
dist.barrier()
elapsed = time.perf_counter() - start
if dist.get_rank() == 0:
    print("BENCH " + json.dumps({"steps_per_second": steps / elapsed}), flush=True)
dist.destroy_process_group()
