"""The PyTorch DDP tutorial's setup(), written for mp.spawn, run under torchrun: it points every
rank at its own MASTER_PORT (argv[1]; the tutorial's is 12355), where no store listens."""

import os
import sys

import torch.distributed as dist

os.environ["MASTER_ADDR"] = "localhost"
os.environ["MASTER_PORT"] = sys.argv[1]
dist.init_process_group("gloo")
