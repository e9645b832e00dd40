"""The divergence finder on four real bugs (tests/workers/divergence.py, 2 ranks): it names the
first parameter or buffer whose copies differ, the first step, and the rank; a correct DDP run
has none. Every rank gets the same answer."""

from __future__ import annotations

import math
import re

import torch

from ddp_kit.divergence import Divergence, difference, named_tensors

WORKER = "divergence.py"
FOUND = re.compile(r"step (\d+): '([\w.]+)' differs from rank 0's copy \(max \|diff\| (\S+)\) "
                   r"on rank 1$")  # fmt: skip
EXPECTED = {  # the bug -> (first step, first tensor)
    "layer outside DDP": (0, "head.weight"),  # body.module.* are averaged, the head is not
    "step skipped on rank 1": (2, "weight"),
    "random buffer": (0, "noise"),  # the parameters agree; the buffer does not
    "no_sync never left": (0, "weight"),
}


def test_each_bug_is_found_at_its_first_step_and_tensor(run):
    assert run.stdout[0] == run.stdout[1]  # every rank, the same answer
    lines = dict(line.split(": ", 1) for line in run.stdout[0].splitlines())
    assert lines.pop("correct") == "none"
    for bug, (step, name) in EXPECTED.items():
        found = FOUND.match(lines[bug])
        assert found, lines[bug]
        assert (int(found[1]), found[2]) == (step, name) and float(found[3]) > 0


def test_a_missing_tensor_is_named_and_ddp_names_are_the_models():
    text = str(Divergence("head.bias", math.nan, [1, 2], step=3, layout=True))
    assert text == "step 3: 'head.bias' is missing, or has another shape or dtype, on ranks 1, 2"
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    names = [name for name, _ in named_tensors(model)]
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                     "1.running_var", "1.num_batches_tracked"]  # fmt: skip


def test_nan_inf_and_tolerance_in_the_comparison_of_two_copies():
    ref = torch.tensor([1.0, float("nan"), 0.0])
    assert difference(ref.clone(), ref, 0.0) is None  # the same bits, NaN included
    assert math.isnan(difference(torch.tensor([float("nan"), 1.0, 0.0]), ref, 0.0))
    assert difference(torch.tensor([1.0, float("nan"), float("inf")]), ref, 0.0) == math.inf
    assert difference(torch.tensor([1.0, float("nan"), -0.0]), ref, 0.0) == 0.0  # other bits
    assert difference(torch.tensor([1.0 + 1e-7, float("nan"), 0.0]), ref, 1e-6) is None
