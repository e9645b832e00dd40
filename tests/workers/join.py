"""Uneven inputs: rank r trains on 2 + r batches under Join."""

import torch
import torch.distributed as dist
from common import batches, mse, target
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.observe import GradientRecorder
from ddp_kit.toy import make_wide_model
from ddp_kit.worker import backend

dist.init_process_group(backend())
rank = dist.get_rank()
model = DDP(make_wide_model())
GradientRecorder(model, prefix="join/")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with Join([model]):
    for x in batches(rank)[: 2 + rank]:
        opt.zero_grad()
        mse(model(x), target(x)).backward()
        opt.step()
dist.destroy_process_group()
