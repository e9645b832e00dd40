"""Distributed evaluation: 17 samples, padded by DistributedSampler; the global mean with and
without the repeated samples masked out."""

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from ddp_kit.worker import backend, record

dist.init_process_group(backend())
data = TensorDataset(torch.arange(17.0).reshape(-1, 1))
sampler = DistributedSampler(data, shuffle=False)
values = torch.cat([x.flatten() for (x,) in DataLoader(data, batch_size=4, sampler=sampler)])
real = torch.arange(dist.get_rank(), sampler.total_size, dist.get_world_size()) < len(data)
totals = torch.stack(
    [values.sum(), torch.tensor(float(len(values))), values[real].sum(), real.sum().float()]
)
dist.all_reduce(totals)
record("eval/padded_mean", totals[0] / totals[1])
record("eval/masked_mean", totals[2] / totals[3])
dist.destroy_process_group()
