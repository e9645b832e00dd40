"""The torch-only reproduction of the teardown deadlock (docs/upstream.md): a DDP step on a
fresh gloo group, destroy the group, return, so freeing the model frees the group at once.

Under bare torchrun (torch 2.13, 2 ranks, CPU) a run hangs within a few rounds: the main thread
in ~ProcessGroupGloo joining a gloo thread that waits for the GIL. Through the kit each round
ends, and it prints the gradient every rank agreed on.
"""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 200


def step(group, round):
    torch.manual_seed(round)
    model = DDP(torch.nn.Linear(10, 5), process_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    torch.manual_seed(100 * round + dist.get_rank())  # each rank its own batch
    model(torch.randn(20, 10)).sum().backward()
    optimizer.step()
    dist.destroy_process_group(group)
    return model.module.bias.grad.clone()  # returning frees the model, then the group


dist.init_process_group("gloo")
for round in range(ROUNDS):
    grad = step(dist.new_group(), round)
print(f"rounds: {ROUNDS}; last bias grad: {grad.tolist()}")
dist.destroy_process_group()
