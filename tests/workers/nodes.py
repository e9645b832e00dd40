"""Two agents, one job: each rank records its node, local and global rank, and an all-reduce."""

import os

import torch
import torch.distributed as dist

from ddp_kit.worker import backend, record

dist.init_process_group(backend())
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
record(
    "where",
    {
        "node": int(os.environ["GROUP_RANK"]),
        "local": int(os.environ["LOCAL_RANK"]),
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
    },
)
record("total", total)
dist.destroy_process_group()
