"""DDP's bucket limits: 25 MiB by default, and a 1 MiB first bucket after the rebuild while
bucket_cap_mb is left at its default. Six 256 x 256 Linear layers: 1,579,008 bytes of gradient."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.observe import GradientRecorder
from ddp_kit.worker import backend, record

dist.init_process_group(backend())
for name, options in [("default", {}), ("explicit", {"bucket_cap_mb": 25})]:
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)]), **options)
    GradientRecorder(model, prefix=name + "/")
    record(name + "/bucket_bytes_cap", model.bucket_bytes_cap)
    for _ in range(3):
        model.zero_grad()
        model(torch.randn(4, 256)).sum().backward()
dist.destroy_process_group()
