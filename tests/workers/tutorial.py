"""The PyTorch DDP tutorial's demos (intermediate_source/ddp_tutorial.rst), as a class pastes
them: a toy model, setup() and cleanup() around each demo, the second demo saving a checkpoint on
rank 0 and loading it everywhere. Adapted to the CPU only: no `.to(rank)` or `device_ids`, rank
and world size from torchrun's environment instead of mp.spawn, and no MASTER_PORT of its own.

Run as a script (bare torchrun or %%torchrun) it runs both demos, one after the other, in one
process: init, destroy, init again. Live ranks run it as a cell, then call a demo per cell.
"""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def setup(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.")
    setup(rank, world_size)
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)
    loss_fn(outputs, labels).backward()
    optimizer.step()
    cleanup()


def demo_checkpoint(rank, world_size):
    print(f"Running DDP checkpoint example on rank {rank}.")
    setup(rank, world_size)
    model = ToyModel()
    ddp_model = DDP(model)
    checkpoint = os.path.join(tempfile.gettempdir(), f"model-{os.environ['MASTER_PORT']}.pt")
    if rank == 0:
        torch.save(ddp_model.state_dict(), checkpoint)
    dist.barrier()  # rank 1 loads only after rank 0 has saved
    ddp_model.load_state_dict(torch.load(checkpoint))
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)
    loss_fn(outputs, labels).backward()
    optimizer.step()
    if rank == 0:
        os.remove(checkpoint)
    cleanup()


def run_demo(demo_fn):
    demo_fn(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))


if __name__ == "__main__":
    run_demo(demo_basic)
    run_demo(demo_checkpoint)
