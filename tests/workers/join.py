"""Uneven inputs: rank r trains on 2 + r batches under Join."""

import copy

import torch
import torch.distributed as dist
from common import batches, mse, target
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.observe import GradientRecorder
from ddp_kit.toy import make_wide_model
from ddp_kit.worker import backend, record

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
# Without a hook: DDP's built-in all-reduce, the last round's synced gradient / this rank's own
for divide in (True, False):
    model = DDP(make_wide_model())
    with Join([model], divide_by_initial_world_size=divide):
        for x in batches(rank)[: 2 + rank]:
            alone = copy.deepcopy(model.module)
            mse(alone(x), target(x)).backward()
            model.zero_grad()
            mse(model(x), target(x)).backward()
    local, synced = (torch.cat([p.grad.reshape(-1) for p in m.parameters()])
                     for m in (alone, model.module))  # fmt: skip
    record(f"no_hook/divide_{divide}/last_factor", float(synced @ local / (local @ local)))
dist.destroy_process_group()
