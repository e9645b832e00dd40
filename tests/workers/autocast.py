"""Mixed precision: a bfloat16 autocast forward over float32 weights, and what DDP all-reduces."""

import torch
import torch.distributed as dist
from common import batches, mse, target
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.observe import GradientRecorder
from ddp_kit.toy import make_wide_model
from ddp_kit.traffic import CollectiveCounter
from ddp_kit.worker import backend, record

dist.init_process_group(backend())
x = batches(dist.get_rank(), steps=1)[0]
model = DDP(make_wide_model())
GradientRecorder(model, prefix="autocast/")
with torch.autocast("cpu", dtype=torch.bfloat16):
    out = model(x)
with CollectiveCounter() as sent:
    mse(out.float(), target(x)).backward()
record("autocast/out_dtype", str(out.dtype))
record("autocast/grad_dtype", str(model.module[0].weight.grad.dtype))
record("autocast/sent_dtypes", ",".join(sent.dtypes()))
dist.destroy_process_group()
