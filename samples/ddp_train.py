#!/usr/bin/python3
"""Trains the tiny Llama-style model of make_real_sample.py with DistributedDataParallel on
CPU (gloo, 2 processes by default) under five gradient all-reduces, and prints one table:
final loss, its gap to fp32's, bytes a rank sends per step and time per step.

    PYTHONPATH=build/python /usr/bin/python3 samples/ddp_train.py [--steps 300] [--d-model 64]

The all-reduces:
  fp32        DDP's default hook (a ring all-reduce of fp32 values).
  bf16        the arithmetic of PyTorch's bf16_compress_hook: the bucket cast to bf16,
              divided by the world size, summed in bf16. DDP accepts that hook only with
              NCCL and gloo has no bf16 all-reduce, so here the bf16 values are all-gathered
              and summed in rank order in bf16; bytes are a ring bf16 all-reduce's.
  fp8-tensor  FP8 as the GIFT artifact and NCCL do it: every gradient tensor encoded once
              to E5M2 with one scale per tensor, no error feedback (gift.encode with
              fp8="e5m2", scale="tensor", vectors included), the decoded values all-reduced
              in fp32 and divided by the world size; bytes are what a ring all-reduce of
              the FP8 codes and their scales would send.
  gift-eucl   gift.ddp.gift_hook, Euclidean coordinates (E4M3, block-128 scales, error
              feedback; bytes counted by the hook).
  gift-auto   gift.ddp.gift_hook with coords="auto": the basis fitted from the Linear
              layers' input moments every --refresh-every steps, each weight whitened where
              the transport measures it helps; its bytes include the moments' all-reduce
              and the basis's broadcast.

The final loss is the mean cross-entropy over fixed windows of the text (the same in every
run), so the runs are compared on the same data. Times are wall-clock on this machine and
vary from run to run; the loss does not (fixed seeds).
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_real_sample import TinyLlama, corpus  # noqa: E402

import gift  # noqa: E402
import gift.ddp  # noqa: E402

MODES = ["fp32", "bf16", "fp8-tensor", "gift-eucl", "gift-auto"]


def ring_bytes(world, elements, bytes_per_element):
    return 2 * (world - 1) * elements * bytes_per_element // world


class Counter:
    """Bytes per step of the hooks that do not count their own."""

    def __init__(self):
        self.bytes_sent = 0


def bf16_hook(counter, bucket):
    buf = bucket.buffer()
    world = dist.get_world_size()
    mine = buf.to(torch.bfloat16).div_(world)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather([p.view(torch.uint8) for p in parts], mine.view(torch.uint8))
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    buf.copy_(total)
    counter.bytes_sent += ring_bytes(world, buf.numel(), 2)
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def fp8_tensor_hook(counter, bucket):
    buf = bucket.buffer()
    world = dist.get_world_size()
    grads = bucket.gradients()
    for g in grads:
        flat = g.reshape(1, -1)  # vectors too: gift.encode keeps 1-D tensors lossless
        frame = gift.encode({"g": flat}, fp8="e5m2", scale="tensor")
        with gift.open(frame) as f:
            f.decode("g", out=flat)
    buf.div_(world)
    dist.all_reduce(buf)
    counter.bytes_sent += ring_bytes(world, buf.numel(), 1) + ring_bytes(world, len(grads), 4)
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def windows(data, ctx, count, gen):
    starts = torch.randint(0, len(data) - ctx - 1, (count,), generator=gen)
    x = torch.stack([data[s:s + ctx] for s in starts])
    y = torch.stack([data[s + 1:s + ctx + 1] for s in starts])
    return x, y


def run(mode, rank, world, args, data):
    torch.manual_seed(0)
    model = TinyLlama(d=args.d_model, layers=args.layers, heads=4, hidden=3 * args.d_model)
    ddp = DDP(model)
    if mode in ("bf16", "fp8-tensor"):
        counter = Counter()
        ddp.register_comm_hook(counter, bf16_hook if mode == "bf16" else fp8_tensor_hook)
    elif mode.startswith("gift"):
        counter = gift.ddp.GiftState(coords="auto" if mode == "gift-auto" else "euclidean",
                                     refresh_every=args.refresh_every)
        counter.attach(ddp)
        ddp.register_comm_hook(counter, gift.ddp.gift_hook)
    else:
        counter = None
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1 + rank)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        x, y = windows(data, args.ctx, args.batch, gen)
        loss = F.cross_entropy(ddp(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        x, y = windows(data, args.ctx, 32, torch.Generator().manual_seed(12345))
        final = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).item()
    elements = sum(p.numel() for p in model.parameters())
    sent = counter.bytes_sent if counter else ring_bytes(world, elements, 4) * args.steps
    coords = ""
    if mode == "gift-auto":
        chosen = counter.tensor_coords()
        coords = f"{sum(c == 'gift' for c in chosen.values())}/{len(chosen)} tensors whitened"
    return final, sent / args.steps, elapsed / args.steps, coords


def worker(rank, world, port, args, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    data = corpus()
    for mode in args.modes:
        result = run(mode, rank, world, args, data)
        if rank == 0:
            queue.put((mode, result))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="windows per rank and step")
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--refresh-every", type=int, default=50)
    ap.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(args.world, port, args, queue), nprocs=args.world, join=True)
    results = dict(queue.get() for _ in args.modes)
    print(f"{args.world} processes (gloo, CPU), {args.steps} steps, d_model {args.d_model}, "
          f"{args.layers} layers, {args.batch}x{args.ctx} tokens per rank and step, "
          f"torch {torch.__version__}\n")
    ref = results.get("fp32", (None,))[0]
    print("| all-reduce | final loss | gap to fp32 | bytes/step (rank) | ms/step | |")
    print("|---|---|---|---|---|---|")
    for mode in args.modes:
        loss, sent, seconds, note = results[mode]
        gap = f"{loss / ref - 1:+.2%}" if ref else "-"
        print(f"| {mode} | {loss:.4f} | {gap} | {sent / 1e3:.1f} kB | {seconds * 1e3:.0f} | "
              f"{note} |")


if __name__ == "__main__":
    main()
