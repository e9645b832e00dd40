"""The observed DDP run of test_observe: sampler shards, the broadcast, recorded gradients and
weights, beside a from-scratch copy and one that never syncs.

Arguments: dataset size, batch per rank, steps, learning rate.
"""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from ddp_kit.observe import GradientRecorder, checksum, record_sampler, record_weights
from ddp_kit.scratch import average_gradients, broadcast_parameters
from ddp_kit.toy import make_dataset, make_model
from ddp_kit.worker import backend, device_ids, record

DATASET_SIZE, BATCH, STEPS = map(int, sys.argv[1:4])
LR = float(sys.argv[4])

dist.init_process_group(backend())
rank = dist.get_rank()
data = make_dataset(DATASET_SIZE)
record_sampler(DistributedSampler(data, shuffle=True, seed=7), epochs=2, name="shard")
record_sampler(DistributedSampler(data, shuffle=False, drop_last=True), name="shard_drop_last")
sampler = DistributedSampler(data, shuffle=True, seed=7)
indices = record_sampler(sampler, name="epoch0")[0]
sampler.set_epoch(0)
loader = DataLoader(data, batch_size=BATCH, sampler=sampler)

model = make_model(seed=rank)  # different on purpose: DDP must broadcast rank 0's weights
record("checksum_before", checksum(model))
ddp = DDP(model, device_ids=device_ids(), bucket_cap_mb=1e-5)
record("checksum_after", checksum(model))
recorder = GradientRecorder(ddp)

scratch = make_model(seed=rank)
broadcast_parameters(scratch)
unsynced = DDP(make_model(seed=rank), device_ids=device_ids())

optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in (ddp, scratch, unsynced)]
loss_fn = torch.nn.MSELoss()
for step, (x, y) in enumerate(loader):
    if step == STEPS:
        break
    record("batch", indices[step * BATCH : (step + 1) * BATCH], step)
    record("x", x, step)
    for opt in optimizers:
        opt.zero_grad()
    loss = loss_fn(ddp(x), y)
    loss.backward()
    record("loss", loss, step)
    loss_fn(scratch(x), y).backward()
    average_gradients(scratch)
    with unsynced.no_sync():
        loss_fn(unsynced(x), y).backward()
    for opt in optimizers:
        opt.step()
    record_weights(ddp, step)
    record_weights(scratch, step, name="scratch_weights")
    record_weights(unsynced, step, name="unsynced_weights")
dist.destroy_process_group()
