"""The torch-only reproduction of the re-initialisation hang (docs/upstream.md): the world made,
used and destroyed 20 times in one process.

Under bare torchrun (torch 2.13, 2 ranks, CPU) it fails within a few rounds: a later world gets
the old one's name and reads the old addresses from torchrun's store ("Connection reset by
peer", or connectFullMesh "timed out connecting"). Through the kit each world has its own name.
"""

import torch
import torch.distributed as dist

for round in range(20):
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"world {round}: {dist.group.WORLD.group_name}, sum {total.item():g}")
    dist.destroy_process_group()
