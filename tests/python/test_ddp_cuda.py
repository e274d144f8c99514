#!/usr/bin/env python3
"""gift.ddp.gift_hook on CUDA buckets: DDP over a model on the GPU, `world` processes.

The buckets go through device plans (gift_transport_cuda.h) and the process group's own
collectives on uint8 CUDA tensors. Asserts: parameters bit-identical on every rank after
every step; every compressed bucket equal, bit for bit, to the host plans' steps replayed on
every rank's recorded input (so the device path gives the CPU path's values, with error
feedback and stochastic rounding, through DDP's bucket rebuild); the loss going down; and
that GIFT coordinates and pickling, which device plans lack, fail with a clear error.

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
from ddp_harness import Recorder, check_against_host_plans, check_replicas  # noqa: E402

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
    try:
        pickle.dumps(state)
    except gift.GiftError as e:
        assert "device plans" in e.message, e.message
    else:
        raise AssertionError("a state with device plans pickled without its error feedback")
    try:
        gift.ddp.GiftState(coords="auto").attach(model)
    except ValueError as e:
        assert "coords=\"euclidean\"" in str(e), str(e)
    else:
        raise AssertionError("GIFT coordinates were accepted for a model on CUDA")


def all_tests(rank, world, tmp):
    test_hook_on_cuda_buckets(rank, world)


def main():
    ddp_harness.run(all_tests, args.world, deadline_s=240, backend=args.backend)


if __name__ == "__main__":
    main()
