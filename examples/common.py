"""The data and the network both example scripts train (no ddp_kit, plain PyTorch)."""

import torch
from torch import nn
from torch.utils.data import TensorDataset


def make_data(size: int = 64, seed: int = 0) -> TensorDataset:
    """`size` samples of y = x . w + noise, 4 features; the same every time."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 4, generator=gen)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(size, 1, generator=gen)
    return TensorDataset(x, y)


def make_model() -> nn.Module:
    """Linear(4, 3) -> Tanh -> Linear(3, 1), with the same initial weights every time."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1))


def save_checkpoint(path: str, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int):
    """Everything needed to continue: weights, optimizer state, the epoch just finished."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
    torch.save(state, path)


def load_checkpoint(
    path: str, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> int:
    """Restore a checkpoint onto `device`, whatever device saved it; the epoch to start at."""
    state = torch.load(path, map_location=device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["epoch"] + 1
