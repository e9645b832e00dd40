"""The emulated slow link under DDP: 4 steps of a 12-layer MLP with 0.5 MiB buckets over
"1 Gbit/s Ethernet", recorded by GradientRecorder (gradients ready, buckets launched and
finished) and by the link itself (each bucket's time on the wire)."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.link import LINKS, EmulatedLink, slow_link_hook
from ddp_kit.observe import GradientRecorder
from ddp_kit.toy import make_wide_model
from ddp_kit.worker import backend, record

dist.init_process_group(backend())
torch.manual_seed(dist.get_rank())
x, y = torch.randn(256, 256), torch.randn(256, 1)
model = DDP(make_wide_model(256, 256, 12), bucket_cap_mb=0.5)
link = EmulatedLink(*LINKS["1 Gbit/s Ethernet"])
GradientRecorder(model, slow_link_hook, link)
for _ in range(4):
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
record("link", {"events": link.events, "alpha": link.model.alpha, "beta": link.model.beta})
dist.destroy_process_group()
