#!/usr/bin/env python3
"""gift.ddp.gift_hook on CUDA buckets: DDP over a model on the GPU, `world` processes.

The buckets go through device plans (gift_transport_cuda.h) and the process group's own
collectives on uint8 CUDA tensors. Asserts: parameters bit-identical on every rank after
every step; every compressed bucket equal, bit for bit, to the host plans' steps replayed on
every rank's recorded input (so the device path gives the CPU path's values, with error
feedback and stochastic rounding, through DDP's bucket rebuild); the loss going down; in GIFT
coordinates (coords="auto", moments collected on the GPU, bases refitted and broadcast over
the process group), the same replay with the plans' bases, the same basis and coordinates on
every rank and some weight whitened; one rank's overflowing gradient skipped by every rank
under a loss scaler's rule, leaving no trace; and a run checkpointed mid-way (the GiftState pickled
with its device plans' states) resuming bit for bit, on the GPU and, from the same
checkpoint, on host plans (the hook's state bytes are the same on CPU and GPU).

Usage: test_ddp_cuda.py --world N --backend nccl|gloo (with PYTHONPATH=<build>/python).
NCCL takes one GPU per rank (rank r on GPU r mod the GPUs: NCCL refuses two ranks on one);
gloo moves CUDA tensors through the host, so several ranks may share one GPU. Exits 77
(skipped) without torch, a CUDA device, a libgift built with CUDA, or NCCL with fewer GPUs
than ranks; GIFT_REQUIRE_CUDA_DEVICE=1 makes that a failure.
"""
import argparse
import os
import pickle
import sys


def skip(why):
    print(f"SKIPPED: {why}")
    sys.exit(1 if os.environ.get("GIFT_REQUIRE_CUDA_DEVICE") == "1" else 77)


args = argparse.ArgumentParser()
args.add_argument("--world", type=int, default=1)
args.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
args = args.parse_args()
try:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError as e:
    skip(f"torch is not installed ({e})")
import gift.ddp

if not gift.have_cuda:
    skip("libgift was built without CUDA")
if not torch.cuda.is_available():
    skip(f"torch {torch.__version__} has no usable CUDA device")
if args.backend == "nccl" and not dist.is_nccl_available():
    skip(f"torch {torch.__version__} has no NCCL")
if args.backend == "nccl" and torch.cuda.device_count() < args.world:
    skip(f"NCCL needs a GPU per rank: {torch.cuda.device_count()} for {args.world} ranks")

import ddp_harness  # noqa: E402 (after the checks, which need no process group)
from ddp_harness import (Recorder, check_against_host_plans, check_replicas,  # noqa: E402
                         flat_params)

STEPS = 12


def batch(rank, step, device):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(64, 32, generator=g)
    w = torch.linspace(-1, 1, 32 * 8).reshape(32, 8)
    return x.to(device), torch.tanh(x @ w).to(device)


def new_model(device):
    torch.manual_seed(0)
    # Over DDP's first bucket of 1 MB, so that there are several.
    return nn.Sequential(nn.Linear(32, 1024), nn.Tanh(), nn.Linear(1024, 256), nn.Tanh(),
                         nn.Linear(256, 8)).to(device)


def test_hook_on_cuda_buckets(rank, world):
    device = torch.device("cuda", torch.cuda.current_device())
    state = gift.ddp.GiftState(coords="euclidean", rounding="stochastic", seed=9, start_iter=1)
    recorder = Recorder()
    model = new_model(device)
    ddp = DDP(model, device_ids=[device.index], bucket_cap_mb=0.05)
    ddp.register_comm_hook(state, recorder.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        x, y = batch(rank, step, device)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        check_replicas(model, world, f"step {step}")
        losses.append(loss.item())
    assert all(plan.device == device for plan in state._plans.values()), "not device plans"
    calls = check_against_host_plans(recorder, state, world, "cuda buckets")
    assert calls >= 2 * (STEPS - 1), f"only {calls} compressed bucket calls"
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.85 * first, f"the loss went from {first} to {last} (means of 3 steps)"
    if rank == 0:
        print(f"cuda buckets: {calls} bucket calls over {len(state._plans)} device plans equal "
              f"to the host plans' steps; replicas identical; loss {first:.4f} -> "
              f"{last:.4f}; bytes {state.bytes_sent / max(state.fp32_bytes, 1):.3f}x "
              "fp32's", flush=True)


def mixing():
    """Inputs x = z S Q: four directions 30x larger than the other 28, in a rotated frame,
    where whitening pays."""
    g = torch.Generator().manual_seed(7)
    q, _ = torch.linalg.qr(torch.randn(32, 32, generator=g))
    s = torch.ones(32)
    s[:4] = 30.0
    return s[:, None] * q


def coords_batch(rank, step, device, mix):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(256, 32, generator=g) @ mix
    w = torch.linspace(-1, 1, 32 * 8).reshape(32, 8) / 30
    return x.to(device), torch.tanh(x @ w).to(device)


def coords_model(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(),
                         nn.Linear(128, 8)).to(device)


def wrap(model, state, device, hook=None):
    """DDP over `model` with the hook of `state` (attached for its statistics)."""
    ddp = DDP(model, device_ids=[device.index], bucket_cap_mb=0.05)
    state.attach(ddp)
    ddp.register_comm_hook(state, hook or gift.ddp.gift_hook)
    return ddp


def steps(ddp, model, opt, rng, rank, world, device, what):
    mix = mixing()
    return ddp_harness.train_steps(ddp, model, opt, rng,
                                   lambda step: coords_batch(rank, step, device, mix), world,
                                   what)


def test_coords_on_cuda_buckets(rank, world):
    device = torch.device("cuda", torch.cuda.current_device())
    state = gift.ddp.GiftState(coords="auto", refresh_every=4, reselect_every=3,
                               rounding="stochastic", seed=4)
    recorder = Recorder()
    model = coords_model(device)
    ddp = wrap(model, state, device, recorder.hook)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    steps(ddp, model, opt, range(12), rank, world, device, "coords ")
    assert state.basis is not None, "no basis was fitted"
    assert all(plan.device == device for plan in state._plans.values()), "not device plans"
    coords = state.tensor_coords()
    seen = [None] * world
    dist.all_gather_object(seen, (state.basis.id, coords))
    assert all(s == seen[0] for s in seen), f"ranks differ in basis or coordinates: {seen}"
    assert "gift" in coords.values(), f"no weight ends in GIFT coordinates: {coords}"
    calls = check_against_host_plans(recorder, state, world, "cuda buckets in gift coordinates")
    if rank == 0:
        print(f"coords: {calls} bucket calls equal to the host plans' steps in basis "
              f"{state.basis.id}; coords {coords}", flush=True)


def test_checkpoint_on_cuda_buckets(rank, world, tmp):
    device = torch.device("cuda", torch.cuda.current_device())
    config = dict(coords="auto", refresh_every=4, reselect_every=3)

    def fresh(state):
        model = coords_model(device)
        return model, wrap(model, state, device), torch.optim.Adam(model.parameters(), lr=3e-3)

    state = gift.ddp.GiftState(**config)
    model, ddp, opt = fresh(state)
    steps(ddp, model, opt, range(10), rank, world, device, "")
    expected = flat_params(model).cpu()

    state = gift.ddp.GiftState(**config)
    model, ddp, opt = fresh(state)
    steps(ddp, model, opt, range(6), rank, world, device, "")
    assert state.basis is not None
    path = os.path.join(tmp, f"cuda-rank{rank}.pt")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "hook": pickle.dumps(state)}, path)
    saved_coords = state.tensor_coords()
    del model, ddp, opt, state

    saved = torch.load(path, map_location=device)
    state = pickle.loads(saved["hook"])
    model, ddp, opt = fresh(state)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    steps(ddp, model, opt, range(6, 7), rank, world, device, "resumed ")
    assert state.tensor_coords() == saved_coords, "the choice of coordinates was not restored"
    steps(ddp, model, opt, range(7, 10), rank, world, device, "resumed ")
    assert torch.equal(flat_params(model).cpu(), expected), "the resumed run differs"
    if rank == 0:
        print(f"checkpoint: resumed on the GPU in basis {state.basis.id} as the uninterrupted "
              "run", flush=True)


def test_cuda_checkpoint_state_loads_into_host_plans(rank, world):
    """The pickled state's plan states load into host plans of the same buckets, which then
    save the same bytes and hold the same coordinates."""
    device = torch.device("cuda", torch.cuda.current_device())
    state = gift.ddp.GiftState(coords="gift", refresh_every=4)
    model = coords_model(device)
    ddp = wrap(model, state, device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    steps(ddp, model, opt, range(6), rank, world, device, "")
    restored = pickle.loads(pickle.dumps(state))
    config = {k: v for k, v in state.config.items() if k != "integrity"}
    for key, plan in state._plans.items():
        specs = state._specs(key, getattr(torch, key[0].split(".")[-1]))
        host = gift.ReducePlan(world, rank, specs, integrity=False, **config)
        host.set_basis(restored.basis)
        host.load_state(restored._saved[key])
        assert host.save_state() == plan.save_state(), f"plan {key}: state bytes differ"
        assert host.coords == plan.coords, f"plan {key}: coordinates differ"
    if rank == 0:
        print(f"checkpoint: {len(state._plans)} device plan states load into host plans",
              flush=True)


def test_overflow_on_cuda_buckets(rank, world):
    device = torch.device("cuda", torch.cuda.current_device())
    ddp_harness.check_overflow_skips_the_step(
        rank, world,
        lambda: DDP(new_model(device), device_ids=[device.index]),
        lambda step: batch(rank, step, device), lambda model: model[2].bias)


def all_tests(rank, world, tmp):
    test_hook_on_cuda_buckets(rank, world)
    test_overflow_on_cuda_buckets(rank, world)
    test_coords_on_cuda_buckets(rank, world)
    test_checkpoint_on_cuda_buckets(rank, world, tmp)
    test_cuda_checkpoint_state_loads_into_host_plans(rank, world)


def main():
    ddp_harness.run(all_tests, args.world, deadline_s=240, backend=args.backend)


if __name__ == "__main__":
    main()
