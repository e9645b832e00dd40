"""Every lesson puts what DDP, FSDP2, ZeRO and the collectives get on `device()` (no GPU needed).

With the GPU backend string "cpu:gloo,cuda:nccl", a CPU tensor still goes through gloo: a lesson
that wraps a CPU model would sync over gloo on a machine with a GPU per rank. tests/placement.py
reads the rank code of every notebook and example (ast) and names each call whose module or
tensor is not placed; the only exceptions are the cells below, which say why in a comment with
the words "on the CPU on purpose".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from placement import ON_PURPOSE, Cell, notebook_cells, script_cells, unplaced
from solutions import EXERCISES

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# The cells that stay on the CPU, and why: each says so in a comment.
GLOO_WAITS = ("a collective that a rank never joins: gloo waits until the collective timeout, "
              "which the kit explains; under nccl the call returns once queued and the watchdog "
              "ends the process (notebook 11, section 6)")
ON_THE_CPU = {
    "10_training_loop.ipynb cell 14 (script)": GLOO_WAITS + ": DDP's forward on rank 0 only",
    "11_pitfalls_and_clusters.ipynb cell 17 (script)": GLOO_WAITS,
    "15_uneven_inputs_join.ipynb cell 3": GLOO_WAITS + ": one rank's extra backward",
    "18_debugging_ddp.ipynb cell 5": GLOO_WAITS,
    "18_debugging_ddp.ipynb cell 9": "cell 5's tensor, all-reduced by every rank this time",
    "18_debugging_ddp.ipynb cell 11": GLOO_WAITS + ": one rank's extra backward",
    "18_debugging_ddp.ipynb cell 37": GLOO_WAITS + ": the exercise's planted early stop",
    "18_debugging_ddp.ipynb cell 38": "the exercise's loss, from cell 37",
    "20_ring_allreduce.ipynb cell 4": "the ring is rebuilt from isend/irecv and compared with "
    "gloo's own all-reduce, itself a ring (NCCL picks among ring and tree)",
    "20_ring_allreduce.ipynb cell 6": "the tensors the ring and gloo's all-reduce sum",
    "22_buckets_and_overlap.ipynb cell 4": "the slow link is emulated by a comm hook that delays "
    "gloo's CPU all-reduce; on GPUs the real link is measured in notebook 21",
    "23_profiler_trace.ipynb cell 4": "the overlap share reads gloo's ranges in a CPU trace; "
    "an nccl trace's collectives are GPU kernels (tracing refuses it: HTA reads those)",
    "25_a_rank_dies.ipynb cell 15 (script)": "two bare torchrun agents stand for two machines: "
    "their rendezvous is the lesson, and gloo on the CPU runs on any machine",
    "28_two_machines.ipynb cell 12 (script)": "a node lost is seen through gloo's connections, "
    "closed at once by the machine that stays up; what nccl reports depends on its transport "
    "(on one machine's GPUs, no connection closes)",
}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_model_and_collective_tensor_of_a_lesson_is_on_device(path):
    found = unplaced(notebook_cells(path))
    assert not found, "\n".join(str(f) for f in found)


def test_the_examples_place_their_model_and_tensors():
    for path in sorted((ROOT / "examples").glob("*.py")):
        assert not unplaced(script_cells(path)), path


def test_the_cells_on_the_cpu_on_purpose_are_the_allowed_ones():
    exempt = {c.where for path in NOTEBOOKS for c in notebook_cells(path) if c.exempt}
    assert exempt == set(ON_THE_CPU)


def test_every_solution_keeps_the_lesson_on_device():
    for exercise in EXERCISES:
        path = ROOT / "notebooks" / f"{exercise.notebook}.ipynb"
        notebook = json.loads(path.read_text())
        source = "".join(notebook["cells"][exercise.cell]["source"])
        notebook["cells"][exercise.cell]["source"] = source.replace(exercise.edit, exercise.right)
        found = unplaced(notebook_cells(path, notebook))
        assert not found, (exercise.notebook, [str(f) for f in found])


def check(*cells: str) -> list[str]:
    """The findings for rank cells given as text, as strings without their cell names."""
    found = unplaced([Cell(f"cell {i}", source) for i, source in enumerate(cells)])
    return [f"{f.call}: {f.what}" for f in found]


PLACED_X = "x = torch.ones(2, device=device())\n"
# (code, what it finds): one finding each, "CALL: the module/tensor/parameters is/are"
LEFT_ON_THE_CPU = [
    ("model = DDP(make_model())", "DDP(make_model()): the module is"),
    ("x = torch.ones(2)\ndist.all_reduce(x)", "dist.all_reduce(x): the tensor is"),
    ("net = make_model()\nnet = DDP(net)", "DDP(net): the module is"),
    ("for layer in net:\n    fully_shard(layer)", "fully_shard(layer): the module is"),
    ("opt = ZeroRedundancyOptimizer(make_model().parameters(), lr=1)",
     "ZeroRedundancyOptimizer(make_model().parameters(), lr=1): the parameters are"),
    ("broadcast_parameters(make_model())", "broadcast_parameters(make_model()): the module is"),
    ("dist.isend(torch.zeros(3), 1)", "dist.isend(torch.zeros(3), 1): the tensor is"),
    ("dist.all_reduce(tensor=torch.ones(2))",
     "dist.all_reduce(tensor=torch.ones(2)): the tensor is"),
    ("m = DDP(make_model().to(torch.device('cpu')))",
     "DDP(make_model().to(torch.device('cpu'))): the module is"),
    # what leaves the device, or never reached it, is not placed
    (PLACED_X + "dist.all_reduce(x.cpu())", "dist.all_reduce(x.cpu()): the tensor is"),
    (PLACED_X + "dist.all_reduce(x.to('cpu'))", "dist.all_reduce(x.to('cpu')): the tensor is"),
    (PLACED_X + "dist.all_reduce(torch.tensor([x.item()]))",
     "dist.all_reduce(torch.tensor([x.item()])): the tensor is"),
    (PLACED_X + "dist.all_reduce(torch.stack([x.sum(), torch.tensor(float(len(x)))]))",
     "dist.all_reduce(torch.stack([x.sum(), torch.tensor(float(len(x)))])): the tensor is"),
]  # fmt: skip


@pytest.mark.parametrize(("code", "finding"), LEFT_ON_THE_CPU)
def test_a_model_or_tensor_left_on_the_cpu_is_named(code, finding):
    assert check(code) == [finding]


def test_placed_models_and_tensors_pass():
    assert check("model = DDP(make_model().to(device()), device_ids=device_ids())") == []
    assert check("dev = device()\nnet = make_model().to(dev)\nmodel = DDP(net)") == []
    assert check("x = torch.ones(2, device=device())\ndist.all_reduce(x * 2)") == []
    assert check("model = DDP(make_model().cuda())") == []
    assert check("net = make_model().to(device())\nfor layer in net:\n    fully_shard(layer)") == []
    # a tensor built from placed ones: a module's output, a method's result, a loss
    assert check("m = make_model().to(device())\nloss = mse(m(x), y)\n"
                 "dist.all_reduce(loss.detach().clone())") == []
    assert check("z = torch.zeros(4, device=p.device)\ndist.all_reduce(z)") == []


def test_a_name_is_read_in_its_own_cell_first_then_in_the_nearest_earlier_one():
    placed_before = "x = torch.ones(2, device=device())"
    assert check(placed_before, "dist.all_reduce(x)") == []
    assert check(placed_before, "x = torch.ones(2)\ndist.all_reduce(x)") == [
        "dist.all_reduce(x): the tensor is"]
    assert check("x = torch.ones(2)", placed_before, "dist.all_reduce(x)") == []


WRAP = "class Wrap:\n    def __init__(self, model):\n        self.ddp = DDP(model)\n"


def test_a_parameter_is_placed_only_when_every_call_passes_a_placed_argument():
    define = "def send(t):\n    dist.isend(t, 1)\n"
    assert check(define + "send(torch.ones(2, device=device()))") == []
    assert check(define + "send(torch.ones(2, device=device()))\nsend(torch.ones(2))") == [
        "dist.isend(t, 1): the tensor is"]
    # a class handed over as an argument, then called: its __init__'s parameters
    wrap = (WRAP + "def train(make_sync):\n    model = make_model(){to}\n    make_sync(model)\n"
            "train(Wrap)\n")
    assert check(wrap.format(to=".to(device())")) == []
    assert check(wrap.format(to="")) == ["DDP(model): the module is"]


def test_the_inputs_of_a_wrapped_model_are_checked():
    model = "model = DDP(make_model().to(device()))\n"
    assert check(model + "x = torch.randn(8, 4)\nmodel(x)") == ["model(x): the input is"]
    assert check(model + "x = torch.randn(8, 4, device=device())\nmodel(x)") == []
    # a later cell's loop rebinds the batch: the nearest earlier binding counts
    assert check(model, "for x, y in loader:\n    model(x)", "model(x)") == [
        "model(x): the input is", "model(x): the input is"]


def test_in_place_moves_devices_as_parameters_hooks_and_instances_are_followed():
    assert check("net = make_model()\nnet.to(device())\nmodel = DDP(net)") == []
    assert check("def train(dev):\n    DDP(make_model().to(dev))\n"
                 "train(torch.device(f'cuda:{rank}'))") == []
    assert check("def hook(state, bucket):\n"
                 "    return dist.all_reduce(bucket.buffer(), async_op=True)") == []
    instance = (WRAP + "    def __call__(self, x):\n        return self.ddp(x)\n"
                "wrap = Wrap(make_model().to(device()))\nwrap({x})\n")
    assert check(instance.format(x="torch.ones(4, device=device())")) == []
    assert check(instance.format(x="torch.ones(4)")) == ["self.ddp(x): the input is"]


def test_a_cell_that_says_it_stays_on_the_cpu_is_exempt():
    assert check(f"x = torch.ones(2)   # {ON_PURPOSE}: why\ndist.all_reduce(x)") == []
