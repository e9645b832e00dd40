"""Exposed communication per step against bucket_cap_mb, measured beside the overhead model
of costmodel.exposed_communication, on gloo alone and on the emulated links of
ddp_kit.link. Arguments: steps per point, then the caps in MiB. Notebook 22's model."""

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.costmodel import exposed_communication
from ddp_kit.link import LINKS, EmulatedLink, slow_link_hook
from ddp_kit.toy import make_wide_model

steps, *caps = sys.argv[1:]
steps, caps = int(steps), [float(c) for c in caps]
dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
x, y = torch.randn(256, 256), torch.randn(256, 1)


def point(cap_mb: float, link: str | None) -> dict:
    """Median step time (forward and backward) and exposed communication (from the last
    gradient ready to backward's end), from step 1 on, and the model's exposed time for each
    step's own backward time (times from time.time(), as the link's)."""
    model = DDP(make_wide_model(256, 256, 12), bucket_cap_mb=cap_mb)
    emulated = EmulatedLink(*LINKS[link]) if link else None
    if emulated:
        model.register_comm_hook(emulated, slow_link_hook)
    ready: list[float] = []
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(lambda _: ready.append(time.time()))
    step_s, exposed, predicted = [], [], []
    for step in range(steps + 1):
        ready.clear()
        start = time.time()
        loss = torch.nn.functional.mse_loss(model(x), y)
        backward_start = time.time()
        loss.backward()
        end = time.time()
        if step == 0:
            continue  # one bucket before DDP's rebuild
        step_s.append(end - start)
        exposed.append(end - max(ready))
        if emulated:
            sizes = [e["bytes"] for e in emulated.events if e["launched"] >= backward_start]
            predicted.append(exposed_communication(sizes, max(ready) - backward_start,
                                                   emulated.model))  # fmt: skip
    return {"cap_mb": cap_mb, "step_s": statistics.median(step_s),
            "exposed_s": statistics.median(exposed),
            "model_s": statistics.median(predicted) if predicted else None}  # fmt: skip


results = {link or "gloo alone": [point(cap, link) for cap in caps]
           for link in [None, "1 Gbit/s Ethernet", "1 Gbit/s, 1 ms away"]}  # fmt: skip
if dist.get_rank() == 0:
    print("BENCH " + json.dumps(results), flush=True)
dist.destroy_process_group()
