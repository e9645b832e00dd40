"""pytorch/examples' distributed/ddp-tutorial-series/datautils.py, seeded: the sibling module
that multigpu_torchrun.py imports (`from datautils import MyTrainDataset`)."""

import torch
from torch.utils.data import Dataset


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        generator = torch.Generator().manual_seed(0)  # the same samples on every rank
        self.data = [(torch.rand(20, generator=generator), torch.rand(1, generator=generator))
                     for _ in range(size)]  # fmt: skip

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]
