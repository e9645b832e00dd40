"""Train on one process.            python examples/single_process.py --epochs 3"""

import argparse

import torch
from common import load_checkpoint, make_data, make_model, save_checkpoint
from torch import nn
from torch.utils.data import DataLoader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train(args, device)


def train(args: argparse.Namespace, device: torch.device) -> None:
    data = make_data()
    order = torch.Generator()
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, generator=order)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    start = load_checkpoint(args.checkpoint, model, optimizer, device) if args.resume else 0

    for epoch in range(start, args.epochs):
        order.manual_seed(epoch)  # a new shuffle every epoch, the same again after a resume
        total = torch.zeros(2, device=device)  # sum of losses, number of samples
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(x), torch.tensor(len(x), device=device)])
        print(f"epoch {epoch}: loss {total[0] / total[1]:.4f} over {int(total[1])} samples")
        save_checkpoint(args.checkpoint, model, optimizer, epoch)


if __name__ == "__main__":
    main()
