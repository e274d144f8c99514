"""What the DDP hook tests share: gloo processes on this machine with a deadline (a hang
fails instead of stalling the suite), and the check that every rank holds the same
parameters."""
import datetime
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def check_replicas(model, world, what):
    mine = flat_params(model)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    for r, theirs in enumerate(everyone):
        if not torch.equal(theirs, mine):
            raise AssertionError(f"{what}: rank {r}'s parameters differ from this rank's")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, tmp, body):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        body(rank, world, tmp)
    finally:
        dist.destroy_process_group()


def run(body, world, deadline_s):
    """Runs body(rank, world, tmp) in `world` gloo processes sharing a temporary folder;
    exits 1 when they do not all finish within deadline_s."""
    print(f"torch {torch.__version__}, {world} processes on gloo", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(_worker, args=(world, _free_port(), tmp, body), nprocs=world,
                                 join=False)
        deadline = time.time() + deadline_s
        while not ctx.join(timeout=max(1.0, deadline - time.time())):
            if time.time() > deadline:
                for p in ctx.processes:
                    p.kill()
                print(f"FAILED: the ranks did not finish in {deadline_s} s (a hang)")
                sys.exit(1)
    print("OK")
