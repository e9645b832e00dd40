"""DDP, ZeRO and FSDP2 side by side: what each rank holds, what is sent, the weights after the
same Adam steps."""

import torch
import torch.distributed as dist
from common import batches, mse, target
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.toy import make_wide_model
from ddp_kit.traffic import CollectiveCounter
from ddp_kit.worker import backend, record


def local_bytes(t: torch.Tensor) -> int:
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()


def wrap(kind: str, net: torch.nn.Module) -> torch.nn.Module:
    if kind == "FSDP2":
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        return fully_shard(net)
    model = DDP(net)
    model.register_comm_hook(None, default_hooks.allreduce_hook)  # counted as one all_reduce
    return model


dist.init_process_group(backend())
for kind in ["DDP", "ZeRO", "FSDP2"]:
    model = wrap(kind, make_wide_model(layers=4))
    if kind == "ZeRO":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for x in batches(dist.get_rank()):
        with CollectiveCounter() as sent:
            mse(model(x), target(x)).backward()
            opt.step()
        opt.zero_grad()
    state = (opt.optim if kind == "ZeRO" else opt).state
    record(
        kind + "/state_bytes",
        sum(local_bytes(v) for s in state.values() for v in s.values() if torch.is_tensor(v)),
    )
    record(kind + "/param_bytes", sum(local_bytes(p) for p in model.parameters()))
    if kind != "FSDP2":  # DDP's flat buckets: a second copy of the gradients
        sizes = model._get_ddp_logging_data()["bucket_sizes"]
        record(kind + "/bucket_bytes", sum(int(size) for size in sizes.split(",")))
    record(kind + "/sent", sent.bytes_by_op())
    record(
        kind + "/weights",
        torch.cat(
            [
                (p.full_tensor() if isinstance(p, DTensor) else p).detach().reshape(-1)
                for p in model.parameters()
            ]
        ),
    )
# gradient_as_bucket_view=True: every .grad is a view into the one bucket, no second copy
viewed = DDP(make_wide_model(layers=4), gradient_as_bucket_view=True)
for x in batches(dist.get_rank())[:2]:
    mse(viewed(x), target(x)).backward()
storages = {p.grad.untyped_storage().data_ptr() for p in viewed.parameters()}
record("view/grad_storages", len(storages))
dist.destroy_process_group()
