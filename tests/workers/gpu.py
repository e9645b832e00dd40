"""One DDP step on GPUs: the model on this rank's GPU before DDP wraps it, the shard moved there."""

import torch.distributed as dist
from common import batches, mse, target
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.observe import GradientRecorder
from ddp_kit.toy import make_wide_model
from ddp_kit.worker import backend, device, device_ids, record

dist.init_process_group(backend())
rank = dist.get_rank()
dev = device()
model = make_wide_model().to(dev)  # on its device first: DDP broadcasts from there
ddp = DDP(model, device_ids=device_ids())
GradientRecorder(ddp, prefix="gpu/")
record("gpu/device", str(next(ddp.parameters()).device))
record("gpu/backend", dist.get_backend())
x = batches(rank)[0].to(dev)
mse(ddp(x), target(x)).backward()
dist.destroy_process_group()
