"""The lessons' seeded data and networks: TinyNet (small enough to print) for the ten steps,
a wider MLP for the lessons after them."""

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


class TwoHeads(nn.Module):
    """Two Linear(2, 1) heads of which forward uses one: `unused` never gets a gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Linear(2, 1), nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def make_wide_dataset(size: int = 512, features: int = 32, seed: int = 0) -> TensorDataset:
    """`size` samples of a fixed random teacher network's output (plus noise), `features` inputs."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(size, features, generator=gen)
    teacher = torch.randn(features, 16, generator=gen) / features**0.5
    y = torch.tanh(x @ teacher).sum(dim=1, keepdim=True) + 0.05 * torch.randn(
        size, 1, generator=gen
    )
    return TensorDataset(x, y)


def make_wide_model(
    features: int = 32, hidden: int = 64, layers: int = 2, seed: int = 0
) -> nn.Module:
    """`layers` blocks of Linear(., hidden) + ReLU, then Linear(hidden, 1) (lessons 13 on)."""
    torch.manual_seed(seed)
    blocks: list[nn.Module] = []
    width = features
    for _ in range(layers):
        blocks += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    return nn.Sequential(*blocks, nn.Linear(width, 1))


def make_image_dataset(size: int = 512, seed: int = 0) -> TensorDataset:
    """`size` random 3 x 32 x 32 "images", each with one target number (their mean brightness
    in the middle, plus noise): enough for timing a convolutional network."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 3, 32, 32, generator=gen)
    y = x[:, :, 8:24, 8:24].mean(dim=(1, 2, 3)).unsqueeze(1) + 0.01 * torch.randn(
        size, 1, generator=gen
    )
    return TensorDataset(x, y)


def make_conv_model(seed: int = 0) -> nn.Module:
    """A small CNN, 3 -> 16 -> 32 channels of 3 x 3 convolutions on 32 x 32 images: 5,121
    weights, all but the last layer's 33 used at every pixel, so much computation per weight."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1),
    )  # fmt: skip


def preview(size: int = 6) -> None:
    """Print the first `size` samples of the lessons' dataset, rounded."""
    data = make_dataset(size)
    for i in range(size):
        x, y = data[i]
        print(f"sample {i}: x = {[round(v, 2) for v in x.tolist()]}, y = {y.item():.2f}")
