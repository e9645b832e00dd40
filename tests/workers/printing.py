"""Prints what every rank shares and what is its own: the output modes' test script."""

import torch
import torch.distributed as dist

from ddp_kit.worker import backend

dist.init_process_group(backend())
rank = dist.get_rank()
print("start of the step")
print(f"loss on this rank: {rank % 2}")
total = torch.tensor([1.0])
dist.all_reduce(total)
print(f"after all_reduce every rank holds {total.item():g}")
if rank == 0:
    print("saved a checkpoint")
dist.destroy_process_group()
