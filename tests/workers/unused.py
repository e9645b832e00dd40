"""A DDP model with a layer that forward never uses, trained for two steps: DDP raises at the
second forward (find_unused_parameters is off); this rank prints the lines of DDP's error that
name what got no gradient."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.worker import backend


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 1)
        self.unused = nn.Linear(4, 1)

    def forward(self, x):
        return self.used(x)


dist.init_process_group(backend())
model = DDP(Net())
try:
    for _ in range(2):
        model(torch.randn(8, 4)).sum().backward()
except RuntimeError as error:
    print("\n".join(line for line in str(error).splitlines() if "did not receive grad" in line))
dist.destroy_process_group()
