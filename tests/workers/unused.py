"""A DDP model with a layer that forward never uses, trained for two steps: DDP raises at the
second forward (find_unused_parameters is off); this rank prints the lines of DDP's error that
name what got no gradient."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.toy import TwoHeads
from ddp_kit.worker import backend

dist.init_process_group(backend())
model = DDP(TwoHeads())  # forward uses `used` only
try:
    for _ in range(2):
        model(torch.randn(8, 2)).sum().backward()
except RuntimeError as error:
    print("\n".join(line for line in str(error).splitlines() if "did not receive grad" in line))
dist.destroy_process_group()
