"""The kit runs code as Python would: a module beside the notebook is imported on the ranks
(%%torchrun, launch() and live ranks), and %%torchrun passes the words after `--` to the script.

The notebook's folder is a temporary working directory holding datautils.py; the script is
pytorch/examples' multigpu_torchrun.py (tests/workers/trainer_example/, CPU version): a Trainer
class, `from datautils import MyTrainDataset`, argparse with two positional arguments.
"""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from support import WORKERS

import ddp_kit
from ddp_kit import LaunchConfigError, Session, WorkerError

pytestmark = pytest.mark.torchrun

EXAMPLE = WORKERS / "trainer_example"
SCRIPT = EXAMPLE / "multigpu_torchrun.py"
SAMPLES, PER_RANK_BATCH, LR = 256, 32, 1e-3  # as in multigpu_torchrun.py's load_train_objs


@pytest.fixture
def notebook_folder(tmp_path, monkeypatch):
    """A notebook's folder with the example's data module beside it, as the working directory
    (the kernel's, which the ranks inherit)."""
    shutil.copy(EXAMPLE / "datautils.py", tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def shell():
    ipython = InteractiveShell.instance()
    ipython.run_line_magic("load_ext", "ddp_kit")
    return ipython


def one_process_checksum(epochs: int, world: int) -> float:
    """The example's training on one process: the same shuffled shards (DistributedSampler,
    seed 0 + epoch), each step on the whole global batch (world x PER_RANK_BATCH), from rank
    0's initial weights, which DDP broadcast."""
    import sys

    sys.path.insert(0, str(EXAMPLE))
    try:
        from datautils import MyTrainDataset
    finally:
        sys.path.remove(str(EXAMPLE))
    data = MyTrainDataset(SAMPLES)
    torch.manual_seed(0)
    model = torch.nn.Linear(20, 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for epoch in range(epochs):
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(epoch)).tolist()
        shards = [order[rank::world] for rank in range(world)]
        for start in range(0, SAMPLES // world, PER_RANK_BATCH):
            batch = [i for shard in shards for i in shard[start : start + PER_RANK_BATCH]]
            x = torch.stack([data[i][0] for i in batch])
            y = torch.stack([data[i][1] for i in batch])
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return weights.double().sum().item()


def test_the_pytorch_example_runs_in_a_torchrun_cell_with_its_arguments(shell, notebook_folder):
    """Pasted into %%torchrun with datautils.py beside the notebook: the sibling import works,
    `-- 3 2 --batch_size 32` reaches argparse, the snapshot lands in the notebook's folder, and
    the ranks end with the weights of the same training on one process."""
    shell.run_cell_magic(
        "torchrun", "-n 2 --output quiet --result trained -- 3 2 --batch_size 32",
        SCRIPT.read_text(),
    )  # fmt: skip
    run = shell.user_ns["trained"]
    steps = SAMPLES // 2 // PER_RANK_BATCH
    for rank in range(2):
        epochs = re.findall(rf"\[rank{rank}\] Epoch (\d) \| Batchsize: 32 \| Steps: {steps}\n",
                            run.stdout[rank])  # fmt: skip
        assert epochs == ["0", "1", "2"], run.stdout[rank]
    assert "Epoch 2 | Training snapshot saved at snapshot.pt" in run.stdout[0]  # save_every 2
    assert torch.load(notebook_folder / "snapshot.pt")["EPOCHS_RUN"] == 3
    checksums = [float(re.search(r"weights checksum (\S+)", out)[1]) for out in run.stdout]
    assert checksums[0] == checksums[1]
    assert checksums[0] == pytest.approx(one_process_checksum(3, 2), abs=1e-5)


def test_a_script_file_imports_from_its_folder_then_the_notebook_folder(notebook_folder):
    """A .py file gets its own folder first (as `python script.py`), the notebook's second."""
    (notebook_folder / "helper.py").write_text("WHERE = 'notebook folder'\n")
    (notebook_folder / "datautils.py").write_text("raise ImportError('the notebook copy')\n")
    result = ddp_kit.launch(EXAMPLE / "probe_imports.py", 1, output="quiet", args=["x", "--y"])
    assert result.stdout[0].splitlines() == [
        f"path {EXAMPLE} {notebook_folder}",
        "helper from notebook folder",
        f"datautils from {EXAMPLE}",
        "argv ['x', '--y']",
    ]


def test_live_ranks_import_from_the_notebook_folder(notebook_folder):
    (notebook_folder / "helper.py").write_text("WHERE = 'notebook folder'\n")
    with Session(2, output="quiet") as session:
        result = session.run(
            "import os, sys\nfrom helper import WHERE\nfrom datautils import MyTrainDataset\n"
            "print(sys.path[0] == os.getcwd(), WHERE, len(MyTrainDataset(8)))"
        )
    assert result.stdout == ["True notebook folder 8\n"] * 2


def test_script_arguments_without_the_separator_are_refused_naming_it(shell):
    with pytest.raises(LaunchConfigError, match="go after `--`: %%torchrun -n 2 -- 50 5"):
        shell.run_cell_magic("torchrun", "-n 2 50 5", "print('never runs')\n")


def test_a_missing_script_argument_is_the_scripts_own_argparse_error(shell, notebook_folder):
    with pytest.raises(WorkerError, match="the following arguments are required: save_every"):
        shell.run_cell_magic("torchrun", "-n 1 --output quiet -- 3", SCRIPT.read_text())
