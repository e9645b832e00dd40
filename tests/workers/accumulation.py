"""Gradient accumulation: 4 micro-batches under no_sync but the last, against one batch of 16."""

import contextlib

import torch
import torch.distributed as dist
from common import batches, mse, target
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.toy import make_wide_model
from ddp_kit.traffic import CollectiveCounter
from ddp_kit.worker import backend, record

dist.init_process_group(backend())
x = batches(dist.get_rank(), steps=1)[0]
for name, parts in [("one_batch", 1), ("accumulated", 4)]:
    model = DDP(make_wide_model())
    model.register_comm_hook(None, default_hooks.allreduce_hook)  # counted as one all_reduce
    with CollectiveCounter() as sent:
        for i, (xs, ys) in enumerate(zip(x.chunk(parts), target(x).chunk(parts), strict=True)):
            with contextlib.nullcontext() if i == parts - 1 else model.no_sync():
                (mse(model(xs), ys) / parts).backward()
    record(f"accumulation/{name}", torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    record(f"accumulation/{name}_calls", len(sent.calls))
dist.destroy_process_group()
