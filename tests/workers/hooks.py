"""Communication hooks: bytes sent per step, and the synced gradient beside the exact average."""

import torch
import torch.distributed as dist
from common import batches, mse, target
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.observe import GradientRecorder
from ddp_kit.toy import make_wide_model
from ddp_kit.traffic import CollectiveCounter
from ddp_kit.worker import backend, record

dist.init_process_group(backend())
hooks = {
    "allreduce": (default_hooks.allreduce_hook, None),
    "fp16": (default_hooks.fp16_compress_hook, None),
    "powerSGD": (
        powerSGD.powerSGD_hook,
        powerSGD.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2),
    ),
}
for name, (hook, state) in hooks.items():
    model = DDP(make_wide_model())
    GradientRecorder(model, hook, state, exact=True, prefix=name + "/")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, x in enumerate(batches(dist.get_rank())):
        opt.zero_grad()
        loss = mse(model(x), target(x))
        with CollectiveCounter() as sent:
            loss.backward()
        opt.step()
        record(name + "/sent", sent.bytes, step)
dist.destroy_process_group()
