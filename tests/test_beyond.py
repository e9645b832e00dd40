"""The lessons after the ten steps, checked on real runs at 2 and 4 ranks: communication hooks,
ZeRO and FSDP2, uneven inputs with Join, mixed precision."""

from __future__ import annotations

import numpy as np
import pytest
import torch.distributed as dist

import ddp_kit
from ddp_kit.traffic import CollectiveCounter, ring_bytes_per_rank, uncounted

STEPS = 6

WORKER = f"""
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as powerSGD
from torch.distributed.algorithms.join import Join
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_kit.observe import GradientRecorder
from ddp_kit.traffic import CollectiveCounter
from ddp_kit.toy import make_wide_model
from ddp_kit.worker import backend, record

dist.init_process_group(backend())
rank = dist.get_rank()
mse = torch.nn.functional.mse_loss
gen = torch.Generator().manual_seed(rank)
batches = [torch.randn(16, 32, generator=gen) for _ in range({STEPS})]

def target(x):
    return torch.tanh(x[:, :8]).sum(dim=1, keepdim=True)

# 1. hooks: bytes sent per step and the synced gradient's distance from the exact average
hooks = {{
    "allreduce": (default_hooks.allreduce_hook, None),
    "fp16": (default_hooks.fp16_compress_hook, None),
    "powerSGD": (powerSGD.powerSGD_hook,
                 powerSGD.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2)),
}}
for name, (hook, state) in hooks.items():
    model = DDP(make_wide_model())
    GradientRecorder(model, hook, state, exact=True, prefix=name + "/")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, x in enumerate(batches):
        opt.zero_grad()
        loss = mse(model(x), target(x))
        with CollectiveCounter() as sent:
            loss.backward()
        opt.step()
        record(name + "/sent", sent.bytes, step)

# 2. sharding: what each rank holds, and the weights after the same Adam steps
def local_bytes(t):
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()

for kind in ["DDP", "ZeRO", "FSDP2"]:
    net = make_wide_model(layers=4)
    if kind == "FSDP2":
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        model = fully_shard(net)
    else:
        model = DDP(net)
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    if kind == "ZeRO":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for x in batches:
        with CollectiveCounter() as sent:
            mse(model(x), target(x)).backward()
            opt.step()
        opt.zero_grad()
    state = (opt.optim if kind == "ZeRO" else opt).state
    record(kind + "/state_bytes", sum(local_bytes(v) for s in state.values() for v in s.values()
                                      if torch.is_tensor(v)))
    record(kind + "/param_bytes", sum(local_bytes(p) for p in model.parameters()))
    record(kind + "/sent", sent.bytes_by_op())
    record(kind + "/weights", torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p)
                                         .detach().reshape(-1) for p in model.parameters()]))

# 3. uneven inputs: rank r trains on 2 + r batches under Join
model = DDP(make_wide_model())
GradientRecorder(model, prefix="join/")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with Join([model]):
    for x in batches[: 2 + rank]:
        opt.zero_grad()
        mse(model(x), target(x)).backward()
        opt.step()

# 4. mixed precision: bfloat16 autocast, float32 weights
model = DDP(make_wide_model())
GradientRecorder(model, prefix="autocast/")
with torch.autocast("cpu", dtype=torch.bfloat16):
    out = model(batches[0])
with CollectiveCounter() as sent:
    mse(out.float(), target(batches[0])).backward()
record("autocast/out_dtype", str(out.dtype))
record("autocast/grad_dtype", str(model.module[0].weight.grad.dtype))
record("autocast/sent_dtypes", ",".join(sent.dtypes()))

# 6. gradient accumulation: 4 micro-batches under no_sync but the last = one batch of 16
import contextlib
def counted_ddp():
    model = DDP(make_wide_model())
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    return model
for name, parts in [("one_batch", 1), ("accumulated", 4)]:
    model = counted_ddp()
    x = batches[0]
    with CollectiveCounter() as sent:
        for i, (xs, ys) in enumerate(zip(x.chunk(parts), target(x).chunk(parts))):
            with contextlib.nullcontext() if i == parts - 1 else model.no_sync():
                (mse(model(xs), ys) / parts).backward()
    record(f"accumulation/{{name}}", torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    record(f"accumulation/{{name}}_calls", len(sent.calls))

# 7. distributed evaluation: 17 samples, padded; sums and counts with the repeats masked out
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
data = TensorDataset(torch.arange(17.0).reshape(-1, 1))
sampler = DistributedSampler(data, shuffle=False)
values = torch.cat([x.flatten() for (x,) in DataLoader(data, batch_size=4, sampler=sampler)])
real = torch.arange(rank, sampler.total_size, dist.get_world_size()) < len(data)
totals = torch.stack([values.sum(), torch.tensor(float(len(values))),
                      values[real].sum(), real.sum().float()])
dist.all_reduce(totals)
record("eval/padded_mean", totals[0] / totals[1])
record("eval/masked_mean", totals[2] / totals[3])

# 5. speedup: an epoch timed on the first 1 and 2 ranks, with and without the all-reduce
from ddp_kit.speedup import epoch_seconds, first_ranks_groups
from ddp_kit.toy import make_wide_dataset
for n, group in first_ranks_groups([1, 2]).items():
    for sync in (True, False):
        seconds = epoch_seconds(make_wide_model, make_wide_dataset(64), 16, group, sync=sync)
        record(f"speedup/{{n}}/{{sync}}", -1.0 if seconds is None else seconds)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def run(request):
    return ddp_kit.launch(WORKER, nproc=request.param, output="quiet")


def relative_errors(records: ddp_kit.Records, name: str) -> np.ndarray:
    synced = records[f"{name}/grad_synced"][:, 0]
    exact = records[f"{name}/grad_exact"][:, 0]
    return np.linalg.norm(synced - exact, axis=1) / np.linalg.norm(exact, axis=1)


def test_every_hook_gives_every_rank_the_same_gradient(run):
    for name in ["allreduce", "fp16", "powerSGD"]:
        synced = run.records[f"{name}/grad_synced"]  # [step, rank, weight]
        assert (synced == synced[:, :1]).all(), name


def test_default_hook_is_the_exact_average_of_the_local_gradients(run):
    records = run.records
    local = records["allreduce/grad_local"]
    mean = local.mean(axis=1)
    assert np.abs(records["allreduce/grad_synced"][:, 0] - mean).max() < 1e-6
    assert np.abs(records["allreduce/grad_exact"][:, 0] - mean).max() < 1e-6


def test_fp16_error_is_nonzero_and_within_float16_rounding(run):
    errors = relative_errors(run.records, "fp16")
    assert (errors > 0).all()
    # float16 keeps 11 significant bits (2**-11 ~ 4.9e-4 per rounding); a few roundings
    # (the cast, the sum over ranks) stay well inside 1e-2 of the gradient's size
    assert errors.max() < 1e-2


def test_powersgd_sends_fewer_bytes_and_approximates(run):
    records = run.records
    default = records["allreduce/sent"][:, 0]
    power = records["powerSGD/sent"][:, 0]
    assert (default == 6337 * 4).all()  # make_wide_model(): 6,337 float32 weights
    assert (records["fp16/sent"][:, 0] == 6337 * 2).all()
    assert (power[:2] == default[:2]).all()  # start_powerSGD_iter=2: plain all-reduce first
    # rank 1: P and Q of the two hidden matrices ((64+64) + (32+64)) + 193 uncompressed
    assert (power[2:] == (224 + 193) * 4).all()
    assert (relative_errors(records, "powerSGD")[2:] > 0.01).all()


def test_zero_shards_optimizer_state_about_one_nth(run):
    records, world = run.records, run.world_size
    ddp_state = records["DDP/state_bytes"][0]
    zero_state = records["ZeRO/state_bytes"][0]
    assert (ddp_state == ddp_state[0]).all()
    # whole parameters are dealt out, so the shares are close to, not exactly, 1/N
    assert zero_state.max() <= 1.25 * ddp_state[0] / world
    # each parameter's state (exp_avg, exp_avg_sq, step) lives on exactly one rank
    assert zero_state.sum() == ddp_state[0]


def test_fsdp2_shards_parameters_and_optimizer_state(run):
    records, world = run.records, run.world_size
    ddp_params = records["DDP/param_bytes"][0, 0]
    fsdp_params = records["FSDP2/param_bytes"][0]
    assert fsdp_params.max() <= ddp_params / world + 65 * 4  # + the unsplittable 1-row layer
    assert records["FSDP2/state_bytes"][0].max() <= 2 * fsdp_params.max() + 40


def test_zero_and_fsdp2_end_with_ddps_weights(run):
    records = run.records
    ddp = records["DDP/weights"][0]
    assert (ddp == ddp[:1]).all()
    assert np.array_equal(records["ZeRO/weights"][0], ddp)
    assert np.abs(records["FSDP2/weights"][0] - ddp).max() < 1e-6


def test_what_each_method_sends(run):
    records = run.records
    sent = {kind: records.get(f"{kind}/sent", 0, 0) for kind in ["DDP", "ZeRO", "FSDP2"]}
    model_bytes = 14657 * 4
    assert sent["DDP"] == {"all_reduce": model_bytes}
    assert sent["ZeRO"] == {"all_reduce": model_bytes, "broadcast": model_bytes}
    assert set(sent["FSDP2"]) == {"all_gather_single", "reduce_scatter_single"}
    padded = sent["FSDP2"]["reduce_scatter_single"]
    assert model_bytes <= padded < model_bytes * 1.05
    assert sent["FSDP2"]["all_gather_single"] * run.world_size == 2 * padded


def test_join_shadows_with_zeros_and_divides_by_the_initial_world(run):
    records, world = run.records, run.world_size
    local = records["join/grad_local"]  # [round, rank, weight]
    assert local.shape[0] == 2 + world - 1  # as many rounds as the busiest rank's batches
    for rank in range(world):
        trained = (np.abs(local[:, rank]).sum(axis=1) > 0).tolist()
        assert trained == [r < 2 + rank for r in range(local.shape[0])], rank
    last = local.shape[0] - 1
    synced = records["join/grad_synced"][last]
    assert np.abs(synced - local[last, world - 1] / world).max() < 1e-7


def test_autocast_computes_in_bf16_and_all_reduces_float32(run):
    records = run.records
    assert records.get("autocast/out_dtype", 0, 0) == "torch.bfloat16"
    assert records.get("autocast/grad_dtype", 0, 0) == "torch.float32"
    assert records.get("autocast/sent_dtypes", 0, 0) == "float32"
    buckets = records.get("autocast/buckets", 0, 0)["buckets"]
    assert {b["dtype"] for b in buckets} == {"float32"}


def test_counter_restores_torch_distributed_and_formulas():
    original = dist.all_reduce
    with CollectiveCounter():
        assert dist.all_reduce is not original
        assert uncounted("all_reduce") is original
    assert dist.all_reduce is original
    assert ring_bytes_per_rank("all_reduce", 100, 4) == 150
    assert ring_bytes_per_rank("reduce_scatter_single", 100, 4) == 75
    assert ring_bytes_per_rank("all_gather_single", 25, 4) == 75
    with pytest.raises(ValueError, match="no ring formula"):
        ring_bytes_per_rank("broadcast", 100, 4)


def test_epoch_seconds_times_the_group_and_skips_the_others(run):
    for n in (1, 2):
        for sync in (True, False):
            seconds = run.records[f"speedup/{n}/{sync}"][0]  # [rank]
            assert (seconds[:n] > 0).all() and (seconds[n:] == -1.0).all()


def test_accumulation_under_no_sync_is_one_batch_with_one_all_reduce(run):
    records = run.records
    one, accumulated = records["accumulation/one_batch"][0], records["accumulation/accumulated"][0]
    assert np.abs(one - accumulated).max() < 1e-6
    assert (accumulated == accumulated[:1]).all()  # synced on every rank
    assert records["accumulation/one_batch_calls"][0, 0] == 1
    assert records["accumulation/accumulated_calls"][0, 0] == 1  # not one per micro-batch


def test_global_eval_mean_leaves_the_padding_out(run):
    records, world = run.records, run.world_size
    masked = records["eval/masked_mean"][0]
    assert np.allclose(masked, 8.0)  # the mean of 0..16
    padded = records["eval/padded_mean"][0]
    repeats = -17 % world
    assert np.allclose(padded, (136 + sum(range(repeats))) / (17 + repeats))


def test_recorder_notes_when_each_gradient_was_ready(run):
    records = run.records
    for step in records.steps("allreduce/buckets"):
        seen = records.get("allreduce/buckets", step, 0)
        assert len(seen["ready"]) == 6  # 3 Linear layers: weight and bias each
        for bucket in seen["buckets"]:  # a bucket is launched once its gradients are ready
            assert bucket["launched"] >= max(seen["ready"][p] for p in bucket["params"])
