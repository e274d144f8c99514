"""What the DDP hook tests share: processes on this machine with a deadline (a hang fails
instead of stalling the suite), the check that every rank holds the same parameters, and
the check that the hook's results are the host plans' (a recorded run replayed through
gift.ReducePlan in one process)."""
import datetime
import gc
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gift.ddp


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def check_replicas(model, world, what):
    mine = flat_params(model)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    for r, theirs in enumerate(everyone):
        if not torch.equal(theirs, mine):
            raise AssertionError(f"{what}: rank {r}'s parameters differ from this rank's")


def train_steps(ddp, model, opt, steps, batch_of, world, what):
    """MSE training on batch_of(step) for each step, the replicas compared after every one;
    returns the last loss averaged over all ranks."""
    for step in steps:
        x, y = batch_of(step)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        check_replicas(model, world, f"{what}step {step}")
    loss = loss.detach().clone()
    dist.all_reduce(loss)
    return loss.item() / world


def _scaled_steps(ddp, batch_of, bias, steps, world, overflow_at):
    """Steps under a loss scaler's rule (GradScaler's: a step whose gradients are not all
    finite is skipped), through the gift hook, on `ddp` (a fresh wrapper of a fresh model).
    At step `overflow_at` the last rank's gradient of element 3 of `bias` overflows to Inf.
    Returns the parameters and the steps skipped."""
    model = ddp.module
    state = gift.ddp.GiftState()
    ddp.register_comm_hook(state, gift.ddp.gift_hook)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    names = {id(p): name for name, p in model.named_parameters()}
    skipped = []
    for step in steps:
        hook = None
        if step == overflow_at and dist.get_rank() == world - 1:
            hook = bias.register_hook(lambda g: g.index_fill(0, torch.tensor([3], device=g.device),
                                                              float("inf")))
        x, y = batch_of(step)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        if hook is not None:
            hook.remove()
        if all(torch.isfinite(p.grad).all() for p in model.parameters()):
            opt.step()
        else:
            skipped.append(step)
            bad = [(names[id(p)], (~torch.isfinite(p.grad)).nonzero().reshape(-1).tolist())
                   for p in model.parameters() if not torch.isfinite(p.grad).all()]
            assert bad == [(names[id(bias)], [3])], f"step {step}: non-finite gradients {bad}"
        check_replicas(model, world, f"loss scaler, step {step}")
        # The run after a skipped step is exact when one plan holds the whole model: the
        # plans of other buckets would keep the skipped step's residuals (gift_transport.h).
        assert step < 2 or len(state._plans) == 1, f"{len(state._plans)} plans"
    return flat_params(model), skipped


def check_overflow_skips_the_step(rank, world, new_ddp, batch_of, bias_of):
    """One rank's overflow reaches every rank as the NaN at its place (E4M3 has no Inf), as
    through DDP's own all-reduce, and nowhere else; every rank skips that step, and the run
    then goes on exactly as a run that never had the step: it left no error feedback.
    new_ddp() gives a fresh DDP wrapper of a freshly seeded model whose buckets, once DDP
    rebuilt them, are one, batch_of(step) a step's batch, bias_of(model) the parameter that
    overflows."""
    ddp = new_ddp()
    got, skipped = _scaled_steps(ddp, batch_of, bias_of(ddp.module), range(8), world, 5)
    assert skipped == [5], f"skipped steps {skipped}, expected [5]"
    ddp = new_ddp()
    expected, _ = _scaled_steps(ddp, batch_of, bias_of(ddp.module),
                                [s for s in range(8) if s != 5], world, None)
    assert torch.equal(got, expected), "the run with the skipped step differs from the one without"
    if rank == 0:
        print("loss scaler: the overflow reached every rank at its place, the step was skipped "
              "everywhere and left no trace", flush=True)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Recorder:
    """Its hook is gift_hook, keeping each plan call's tensors before and after it (on the
    host) and the basis the plan held, for check_against_host_plans. A plan call is a bucket
    of the state's first layout, or a group gathered from several buckets of a later one."""

    def __init__(self):
        self.calls = []  # (plan key, plan specs, inputs, outputs, basis)

    def hook(self, state, bucket):
        run_group = state._run_group

        def recorded(key, world, rank, parts, addresses=None):
            dtype = parts[0][0].dtype
            specs = state._specs(key, dtype)
            before = _pieces(parts, specs)
            # The plans take a refreshed basis at the end of a step, with state.basis: what
            # the state holds before the call is what the call's plan holds.
            basis = state.basis
            run_group(key, world, rank, parts, addresses)
            self.calls.append((key, specs, before, _pieces(parts, specs), basis))

        state._run_group = recorded
        try:
            return gift.ddp.gift_hook(state, bucket)
        finally:
            del state._run_group


def _pieces(parts, specs):
    """Host copies of the tensors at parts ((bucket buffer, byte offset)) of the specs'
    shapes."""
    out = []
    for (buf, offset), (_, _, shape) in zip(parts, specs):
        at = offset // buf.element_size()
        out.append(buf[at:at + torch.Size(shape).numel()].reshape(shape).to("cpu", copy=True))
    return out


def check_against_host_plans(recorder, state, world, what):
    """Replays every rank's recorded calls through host plans (integrity off: device plans
    have none, and it does not change values), all ranks in this process, each plan taking
    the basis the hook's plan held when it changes, and asserts the hook gave every rank the
    replay's tensors bit for bit."""
    everyone = [None] * world
    dist.all_gather_object(everyone, recorder.calls)
    config = {k: v for k, v in state.config.items() if k != "integrity"}
    plans, held = {}, {}
    for i, calls in enumerate(zip(*everyone)):
        key, specs, basis = calls[0][0], calls[0][1], calls[0][4]
        if key not in plans:
            plans[key] = [gift.ReducePlan(world, r, specs, integrity=False, **config)
                          for r in range(world)]
            held[key] = None
        ranks = plans[key]
        # The same object as long as the hook's state held it (one pickle keeps identities).
        if basis is not held[key]:
            for p in ranks:
                p.set_basis(basis)
            held[key] = basis
        values = [[t.clone() for t in call[2]] for call in calls]
        m = ranks[0].message_bytes
        sends = [p.encode_shards(x) for p, x in zip(ranks, values)]
        recv = [torch.cat([s[r * m:(r + 1) * m] for s in sends]) for r in range(world)]
        gathered = torch.cat([p.sum_shard(x) for p, x in zip(ranks, recv)])
        for r, (p, x, call) in enumerate(zip(ranks, values, calls)):
            p.decode_result(gathered, x)
            for name, got, want in zip(p.names, call[3], x):
                if not torch.equal(got, want):
                    raise AssertionError(f"{what}: call {i}, rank {r}, {name}: the hook's "
                                         "result differs from the host plans'")
    return len(recorder.calls)


def _worker(rank, world, port, tmp, body, backend):
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        body(rank, world, tmp)
    finally:
        # The tests that end a backward pass with the hook's exception leave DDP wrappers in
        # reference cycles (through the traceback); collected at interpreter exit, their
        # reducers' teardown can abort torch ("terminate called without an active
        # exception", seen once in CI after every check had passed). Collected here, while
        # the process group and the interpreter are alive.
        gc.collect()
        dist.destroy_process_group()
    # Every check of this rank passed: leave without the interpreter's teardown, whose
    # torch-internal destructors are not what these tests test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(body, world, deadline_s, backend="gloo"):
    """Runs body(rank, world, tmp) in `world` processes of `backend` (nccl: rank r on GPU
    r mod the GPUs) sharing a temporary folder; exits 1 when they do not all finish within
    deadline_s."""
    print(f"torch {torch.__version__}, {world} processes on {backend}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(_worker, args=(world, _free_port(), tmp, body, backend),
                                 nprocs=world, join=False)
        deadline = time.time() + deadline_s
        while not ctx.join(timeout=max(1.0, deadline - time.time())):
            if time.time() > deadline:
                for p in ctx.processes:
                    p.kill()
                print(f"FAILED: the ranks did not finish in {deadline_s} s (a hang)")
                sys.exit(1)
    print("OK")
