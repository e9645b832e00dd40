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
# PowerSGD's rule, (n + m) x r x 2 < n x m (min_compression_rate=2): from rank 11 the 64 x 32
# weight is sent whole, from rank 16 the 64 x 64 one too
for rank in (10, 11, 16):
    model = DDP(make_wide_model())
    state = powerSGD.PowerSGDState(None, matrix_approximation_rank=rank, start_powerSGD_iter=2)
    model.register_comm_hook(state, powerSGD.powerSGD_hook)
    for step, x in enumerate(batches(dist.get_rank(), steps=3)):
        loss = mse(model(x), target(x))
        with CollectiveCounter() as sent:
            loss.backward()
        record(f"powerSGD r={rank}/sent", sent.bytes, step)
# bf16_compress_hook: PyTorch checks the build when it registers the hook, not the backend.
# Only its own refusal counts as refused: any other TypeError fails the run.
REFUSAL = "BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+"
try:
    DDP(make_wide_model()).register_comm_hook(None, default_hooks.bf16_compress_hook)
    record("bf16/registered", 1)
except TypeError as error:
    if REFUSAL not in str(error):
        raise
    record("bf16/registered", 0)
dist.destroy_process_group()
