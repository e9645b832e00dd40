"""Time gloo all_reduce for each message size given (bytes) as an argument."""

import json
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
sizes = [int(s) for s in sys.argv[1:]]
seconds = []
for size in sizes:
    tensor = torch.ones(size // 4)
    iterations = max(3, min(200, (16 << 20) // size))
    for _ in range(2):
        dist.all_reduce(tensor)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor)
    seconds.append((time.perf_counter() - start) / iterations)
if dist.get_rank() == 0:
    print("BENCH " + json.dumps({"seconds": seconds}), flush=True)
dist.destroy_process_group()
