"""Four bugs that make the ranks' models differ, and a correct DDP run, each watched every step
with DivergenceWatch; every rank prints what it found ("none" for the correct run)."""

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.divergence import DivergenceWatch
from ddp_kit.worker import backend

STEPS = 4


class Noisy(nn.Module):
    """A linear layer with a buffer refreshed from this rank's random numbers every forward."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.register_buffer("noise", torch.zeros(4))

    def forward(self, x):
        self.noise.copy_(torch.rand(4))
        return self.linear(x + self.noise)


class TwoParts(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(self.body(x))


def train(name, make, skip_on_rank1=None, never_sync=False):
    torch.manual_seed(0)  # the same initial weights on every rank
    net, watched = make()
    optimizer = torch.optim.SGD(watched.parameters(), lr=0.1)
    watch = DivergenceWatch(watched)
    torch.manual_seed(100 + dist.get_rank())  # each rank its own data (and noise)
    no_sync = net.no_sync() if never_sync else contextlib.nullcontext()
    with no_sync:
        for step in range(STEPS):
            optimizer.zero_grad()
            net(torch.randn(8, 4)).pow(2).mean().backward()
            if not (step == skip_on_rank1 and dist.get_rank() == 1):
                optimizer.step()
            watch.check(step)
    print(f"{name}: {watch.first or 'none'}")


def linear():
    model = DDP(nn.Linear(4, 1))
    return model, model  # (what trains, what is watched)


def noisy():
    model = DDP(Noisy())
    return model, model


def layer_outside_ddp():
    net = TwoParts()
    net.body = DDP(net.body)  # the head is left out: its gradients are never averaged
    return net, net


dist.init_process_group(backend())
train("correct", linear)
train("layer outside DDP", layer_outside_ddp)
train("step skipped on rank 1", linear, skip_on_rank1=2)
train("random buffer", noisy)
train("no_sync never left", linear, never_sync=True)
dist.destroy_process_group()
