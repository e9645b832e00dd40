"""Train on N processes with DDP.   torchrun --nproc-per-node 4 examples/ddp_train.py --epochs 3"""

import argparse
import os

import torch

# Imported before init_process_group, not by DDP's constructor later (torch 2.13): with it comes
# torch.distributed.nn, whose defaults would keep the group alive after destroy_process_group
# (gloo's threads then die with the interpreter, and a rank can abort at exit), and imported
# from inside DDP it leaves a reference cycle that keeps the first DDP model alive until the
# garbage collector runs. Counts: docs/upstream.md, section 4.
import torch._dynamo  # noqa: F401
import torch.distributed as dist
from common import load_checkpoint, make_data, make_model, save_checkpoint
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)  # per process
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])  # torchrun: this process's index on its machine
    if torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):  # a GPU each: nccl
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:  # CPU processes: gloo
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    train(args, device, local_rank)
    dist.destroy_process_group()  # train() returned: its DDP model (it holds the group) is gone


def train(args: argparse.Namespace, device: torch.device, local_rank: int) -> None:
    rank = dist.get_rank()  # this process's index among all processes, on all machines
    data = make_data()
    # each process gets its own part, all of one length (padded with repeats unless drop_last)
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = make_model().to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    start = load_checkpoint(args.checkpoint, model.module, optimizer, device) if args.resume else 0

    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every process
        total = torch.zeros(2, device=device)  # sum of losses, number of samples
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()  # DDP averages the gradients over all processes here
            optimizer.step()
            total += torch.stack([loss.detach() * len(x), torch.tensor(len(x), device=device)])
        dist.all_reduce(total)  # every process's sums added: the mean over all samples seen
        if rank == 0:
            print(f"epoch {epoch}: loss {total[0] / total[1]:.4f} over {int(total[1])} samples")
        if rank == 0:  # the copies are identical: one process saves, without DDP's "module."
            save_checkpoint(args.checkpoint, model.module, optimizer, epoch)
        dist.barrier()  # nobody goes on (or reads the file) before it is written


if __name__ == "__main__":
    main()
