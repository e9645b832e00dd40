"""The small, seeded dataset and network every lesson uses (small enough to print)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

FEATURES = 4
HIDDEN = 3


def make_dataset(size: int = 16, seed: int = 0) -> TensorDataset:
    """`size` samples of y = x . w_true + noise, with 4 features; the same for every seed."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(size, FEATURES, generator=gen)
    w_true = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    y = x @ w_true + 0.1 * torch.randn(size, 1, generator=gen)
    return TensorDataset(x, y)


class TinyNet(nn.Module):
    """Linear(4, 3) -> Tanh -> Linear(3, 1): 19 weights, few enough to look at one by one."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(FEATURES, HIDDEN)
        self.act = nn.Tanh()
        self.out = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.hidden(x)))


def make_model(seed: int = 0) -> TinyNet:
    """A TinyNet whose initial weights depend only on `seed`."""
    torch.manual_seed(seed)
    return TinyNet()


def preview(size: int = 6) -> None:
    """Print the first `size` samples of the lessons' dataset, rounded."""
    data = make_dataset(size)
    for i in range(size):
        x, y = data[i]
        print(f"sample {i}: x = {[round(v, 2) for v in x.tolist()]}, y = {y.item():.2f}")
