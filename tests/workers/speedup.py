"""An epoch timed on the first 1 and 2 ranks, with and without the all-reduce."""

import torch.distributed as dist

from ddp_kit.speedup import epoch_seconds, first_ranks_groups
from ddp_kit.toy import make_wide_dataset, make_wide_model
from ddp_kit.worker import backend, record

dist.init_process_group(backend())
for n, group in first_ranks_groups([1, 2]).items():
    for sync in (True, False):
        seconds = epoch_seconds(make_wide_model, make_wide_dataset(64), 16, group, sync=sync)
        record(f"speedup/{n}/{sync}", -1.0 if seconds is None else seconds)
dist.destroy_process_group()
