"""Train on one process.            python examples/single_process.py --epochs 3"""

import argparse

import torch
from common import make_data, make_model
from torch import nn
from torch.utils.data import DataLoader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    data = make_data()
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        total = torch.zeros(2, device=device)  # sum of losses, number of samples
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(x), torch.tensor(len(x), device=device)])
        print(f"epoch {epoch}: loss {total[0] / total[1]:.4f} over {int(total[1])} samples")
    torch.save(model.state_dict(), args.checkpoint)


if __name__ == "__main__":
    main()
