"""What the topic workers share: the same batches on every run, and the regression target."""

import torch

STEPS = 6


def batches(rank: int, steps: int = STEPS) -> list[torch.Tensor]:
    """Rank r's own `steps` batches of 16 samples of 32 features (seeded by the rank)."""
    gen = torch.Generator().manual_seed(rank)
    return [torch.randn(16, 32, generator=gen) for _ in range(steps)]


def target(x: torch.Tensor) -> torch.Tensor:
    """The function the wide model learns: a sum of tanh over the first 8 features."""
    return torch.tanh(x[:, :8]).sum(dim=1, keepdim=True)


mse = torch.nn.functional.mse_loss
