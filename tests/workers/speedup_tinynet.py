"""Notebook 17's TinyNet, 2 samples per rank: an epoch of 256 samples timed on the first 1 and 4
ranks, with and without the all-reduce; each time the best of 5 epochs (a 1-rank epoch lasts
some 50 ms: the best of several damps another process's burst on the 2 shared cores)."""

import torch.distributed as dist

from ddp_kit.speedup import epoch_seconds, first_ranks_groups
from ddp_kit.toy import make_dataset, make_model
from ddp_kit.worker import backend, record

dist.init_process_group(backend())
data = make_dataset(256)
for n, group in first_ranks_groups([1, 4]).items():
    for sync in (True, False):
        times = [epoch_seconds(make_model, data, 2, group, sync=sync) for _ in range(5)]
        record(f"tinynet/{n}/{sync}", -1.0 if times[0] is None else min(times))
dist.destroy_process_group()
