#!/usr/bin/env python3
"""gift.ddp.gift_hook in DistributedDataParallel: `world` CPU processes on gloo.

Asserts, for a small MLP and a tiny transformer over 50 steps: parameters bit-identical on
every rank after every step, the final loss within 2% of the fp32 all-reduce run's, and at
most 0.3x the bytes per step of a ring fp32 all-reduce (none at world 1). That every
compressed bucket ends as the host plans' steps replayed on every rank's recorded input
(stochastic rounding, error feedback, DDP's bucket rebuild after the first step), and that a
bucket of 300 tensors has its gradients walked once, not every step. Then that
a run checkpointed mid-way (the state pickled, a new DDP wrapper) continues exactly as the
uninterrupted run, that uneven inputs under DDP.join() finish with identical replicas, and
that one rank's overflowing gradient makes every rank skip the step under a loss scaler's
rule, without a trace in the steps after, and that a plan's status error on one rank raises
on every rank.

Usage: test_ddp.py --world N (with PYTHONPATH=<build>/python). Exits 77 (skipped) without
torch.
"""
import argparse
import os
import pickle
import sys
import time

try:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError as e:
    print(f"SKIPPED: the DDP hook tests need torch ({e}); scripts/setup.sh installs python3-torch")
    sys.exit(77)

import ddp_harness
import gift.ddp
from ddp_harness import Recorder, check_against_host_plans, check_replicas, flat_params

STEPS = 50


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(),
                                 nn.Linear(128, 8))

    def forward(self, x):
        return self.net(x)


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 64)
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1)
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x))).squeeze(-1)


def batch(kind, rank, step):
    """Rank's batch of `step`, from a fixed teacher: the same data in every run."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    if kind == "mlp":
        x = torch.randn(32, 32, generator=g)
        w = torch.linspace(-1, 1, 32 * 8).reshape(32, 8)
        return x, torch.tanh(x @ w)
    x = torch.randn(16, 8, 8, generator=g)
    return x, x.sum(-1).cumsum(-1) / 8


def new_model(kind):
    torch.manual_seed(0)
    return Mlp() if kind == "mlp" else Transformer()


def train(kind, rank, world, state=None, steps=range(STEPS), model=None, opt=None):
    """Trains with `state` (None: DDP's default fp32 all-reduce); returns the last loss over
    all ranks, the model and the optimizer. Replicas are compared after every step."""
    model = model or new_model(kind)
    ddp = DDP(model)
    if state is not None:
        ddp.register_comm_hook(state, gift.ddp.gift_hook)
    opt = opt or torch.optim.Adam(model.parameters(), lr=3e-3)
    loss = ddp_harness.train_steps(ddp, model, opt, steps, lambda step: batch(kind, rank, step),
                                   world, f"{kind}, ")
    return loss, model, opt


def test_convergence_and_bytes(rank, world, kind):
    start = time.time()
    ref, _, _ = train(kind, rank, world)
    state = gift.ddp.GiftState()
    got, _, _ = train(kind, rank, world, state)
    ratio = state.bytes_sent / max(state.fp32_bytes, 1)
    if rank == 0:
        print(f"{kind}: final loss fp32 {ref:.5f}, gift {got:.5f} ({got / ref - 1:+.2%}); "
              f"bytes {ratio:.3f}x fp32's; {time.time() - start:.1f} s", flush=True)
    assert abs(got - ref) <= 0.02 * ref, f"{kind}: loss {got} against fp32's {ref}"
    assert ratio <= 0.3 if world > 1 else state.bytes_sent == 0, \
        f"{kind}: {state.bytes_sent} bytes, {ratio:.3f}x the bytes of fp32"


def test_hook_equals_host_plans(rank, world, **ddp_options):
    state = gift.ddp.GiftState(rounding="stochastic", seed=3, start_iter=1)
    recorder = Recorder()
    torch.manual_seed(0)
    # Over DDP's first bucket of 1 MB, so that there are several.
    model = nn.Sequential(nn.Linear(32, 1024), nn.Tanh(), nn.Linear(1024, 256), nn.Tanh(),
                          nn.Linear(256, 8))
    ddp = DDP(model, bucket_cap_mb=0.05, **ddp_options)
    ddp.register_comm_hook(state, recorder.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        x, y = batch("mlp", rank, step)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    calls = check_against_host_plans(recorder, state, world, "wide mlp")
    # A plan per bucket of DDP's rebuilt layout (static_graph rebuilds a step later), each run
    # once per compressed step after the rebuild.
    later = 4 if ddp_options.get("static_graph") else 5
    plans = len(state._plans)
    assert plans >= 2 and calls == later * plans + (5 - later), \
        f"{calls} plan calls for {plans} plans over 5 steps ({ddp_options})"
    if rank == 0:
        print(f"replay {ddp_options}: {calls} calls of {plans} plans equal to the host plans' "
              "steps", flush=True)


class Bucket:
    """A bucket of the gradients of `params` as DDP hands it to the hook (views into one
    buffer of `dtype`), counting how often the hook walks its gradients."""

    def __init__(self, params, rank, dtype=torch.float32):
        torch.manual_seed(len(params))
        self.params = params
        sizes = [p.numel() for p in params]
        self.buf = (torch.randn(sum(sizes)) * (rank + 1)).to(dtype)
        self.grads = [g.view(p.shape) for g, p in zip(self.buf.split(sizes), params)]
        self.walks = 0

    def parameters(self):
        return self.params

    def gradients(self):
        self.walks += 1
        return self.grads

    def buffer(self):
        return self.buf

    def is_last(self):
        return True


def test_hundreds_of_tensors_in_one_call(rank, world):
    """Per step, a bucket of 300 tensors costs a lookup of its layout and one binding call
    per step of the algorithm: the hook walks its gradients only when it meets the layout."""
    bucket = Bucket([nn.Parameter(torch.empty(4, 16)) for _ in range(300)], rank)
    state = gift.ddp.GiftState()
    start = time.time()
    for _ in range(5):
        gift.ddp.gift_hook(state, bucket).wait()
    assert bucket.walks == 1, f"the gradients were walked {bucket.walks} times in 5 steps"
    everyone = [torch.empty_like(bucket.buf) for _ in range(world)]
    dist.all_gather(everyone, bucket.buf)
    assert all(torch.equal(b, bucket.buf) for b in everyone), "ranks differ"
    if rank == 0:
        print(f"300 tensors: {(time.time() - start) / 5 * 1e3:.1f} ms per step, the gradients "
              "walked once", flush=True)


def test_checkpoint_resumes_bit_for_bit(rank, world, tmp):
    config = dict(rounding="stochastic", seed=5, start_iter=3)
    whole, model, _ = train("mlp", rank, world, gift.ddp.GiftState(**config), range(20))
    expected = flat_params(model)

    state = gift.ddp.GiftState(**config)
    _, model, opt = train("mlp", rank, world, state, range(10))
    path = os.path.join(tmp, f"rank{rank}.pt")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "hook": pickle.dumps(state)}, path)
    del model, opt, state

    saved = torch.load(path)
    model = new_model("mlp")
    model.load_state_dict(saved["model"])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    opt.load_state_dict(saved["opt"])
    state = pickle.loads(saved["hook"])
    assert state.process_group is None and state.iter == 10
    _, model, _ = train("mlp", rank, world, state, range(10, 20), model, opt)
    assert torch.equal(flat_params(model), expected), "the resumed run differs"
    if rank == 0:
        print("checkpoint: the resumed run matches the uninterrupted one", flush=True)


def test_checkpoint_of_another_rank_or_world(rank, world, tmp):
    """A rank's pickled state loaded by another rank (or at another world size) failed inside
    the first backward (the plan states name their world and rank). Now every rank drops the
    plan states alike, with a warning on rank 0, and the run goes on with identical replicas."""
    if world < 2:
        return
    state = gift.ddp.GiftState(coords="euclidean")
    _, model, opt = train("mlp", rank, world, state, range(6))
    with open(os.path.join(tmp, f"state{rank}.pkl"), "wb") as f:
        pickle.dump(state, f)
    dist.barrier()
    with open(os.path.join(tmp, f"state{(rank + 1) % world}.pkl"), "rb") as f:
        state = pickle.load(f)
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train("mlp", rank, world, state, range(6, 9), model, opt)
    said = [str(w.message) for w in caught if "saved at another world size or rank" in
            str(w.message)]
    assert len(said) == (1 if rank == 0 else 0), said
    check_replicas(model, world, "after another rank's state")
    if rank == 0:
        print("another rank's checkpoint: plan states dropped on every rank, replicas identical",
              flush=True)


def test_frozen_and_cast_parameters(rank, world):
    """Plans settle on DDP's layout; a wrapper made after some parameters were frozen leaves
    a group that can no longer fill: its gradients still travel (a new plan), replicas stay
    identical, the training goes on. Then bf16 buckets of the same parameters (gloo in torch
    1.13 cannot build a DDP of a bf16 model: the hook's own buckets stand in) get plans of
    their own in place of the fp32 ones, and every rank gets the same average."""
    state = gift.ddp.GiftState()
    model = new_model("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    train("mlp", rank, world, state, range(5), model, opt)
    assert state._quiet == 2, "the plans did not settle"
    for p in model.net[0].parameters():
        p.requires_grad_(False)
    train("mlp", rank, world, state, range(5, 9), model, opt)
    frozen = {id(p) for p in model.net[0].parameters()}
    assert all(id(state._param_of[q]) not in frozen for key in state._groups for q in key[1])
    bucket = Bucket([p for p in model.parameters() if p.requires_grad], rank, torch.bfloat16)
    for _ in range(3):
        gift.ddp.gift_hook(state, bucket).wait()
        mine = bucket.buf.float()
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
        assert all(torch.equal(b, mine) for b in everyone), "ranks differ on the bf16 bucket"
    assert {key[0] for key in state._groups} == {"torch.bfloat16"}, state._groups
    if rank == 0:
        print(f"frozen and cast: {len(state._groups)} plans after both changes, replicas "
              "identical", flush=True)


def test_parameters_cast_or_resized_in_place(rank, world):
    """The same parameter objects cast (what model.to(dtype) does) or given another shape
    (.data replaced) come back in a bucket of the same parameters: the plans made for them
    must not run on the new buffer (an fp32 plan read and wrote a bf16 buffer past its end;
    a plan of the old shape whitened and scaled the wrong rows). Every rank gets the average
    within FP8's error, and the same bytes."""
    params = [nn.Parameter(torch.empty(64, 128)), nn.Parameter(torch.empty(128))]
    state = gift.ddp.GiftState(coords="euclidean")
    for _ in range(4):
        gift.ddp.gift_hook(state, Bucket(params, rank)).wait()
    assert state._quiet == 2, "the plans did not settle"

    def check(bucket, what):
        exact = bucket.buf.float().clone()
        dist.all_reduce(exact)
        exact /= world
        gift.ddp.gift_hook(state, bucket).wait()
        got = bucket.buf.float()
        everyone = [torch.empty_like(got) for _ in range(world)]
        dist.all_gather(everyone, got)
        assert all(torch.equal(b, got) for b in everyone), f"{what}: the ranks differ"
        error = ((got - exact).norm() / exact.norm()).item()
        assert error < 0.1, f"{what}: relative error {error} against the exact average"
        specs = {tuple(s) for plan in state._plans.values() for _, _, s in plan._specs}
        assert specs <= {tuple(p.shape) for p in params}, f"{what}: plans of shapes {specs}"
        return error

    for p in params:
        p.data = p.data.to(torch.bfloat16)
    cast = [check(Bucket(params, rank, torch.bfloat16), "cast") for _ in range(2)]
    assert {key[0] for key in state._groups} == {"torch.bfloat16"}, state._groups
    params[0].data = torch.empty(64, 256, dtype=torch.bfloat16)
    grown = [check(Bucket(params, rank, torch.bfloat16), "grown") for _ in range(2)]
    params[0].data = torch.empty(16, 8, dtype=torch.bfloat16)
    shrunk = [check(Bucket(params, rank, torch.bfloat16), "shrunk") for _ in range(2)]
    # Resized in a step whose first bucket waits for the groups of a later one (as a new
    # wrapper's first buckets do): the bucket before it still gets its average.
    params = [nn.Parameter(torch.empty(32, 64)) for _ in range(3)]
    state = gift.ddp.GiftState(coords="euclidean")
    for _ in range(4):
        gift.ddp.gift_hook(state, Bucket(params, rank)).wait()
    params[2].data = torch.empty(8, 8)
    first, second = Bucket(params[:1], rank), Bucket(params[1:], rank)
    first.is_last = lambda: False
    exact = [b.buf.clone() for b in (first, second)]
    for e in exact:
        dist.all_reduce(e)
        e /= world
    futures = [gift.ddp.gift_hook(state, b) for b in (first, second)]
    for f, b, e in zip(futures, (first, second), exact):
        f.wait()
        error = ((b.buf - e).norm() / e.norm()).item()
        assert error < 0.1, f"resized mid-step: relative error {error}"
    bad = Bucket(params, rank, torch.bfloat16)
    bad.grads[0] = torch.empty(16, 8, dtype=torch.bfloat16)  # not in the bucket's buffer
    try:
        gift.ddp.gift_hook(gift.ddp.GiftState(coords="euclidean"), bad)
        raise AssertionError("a gradient outside the bucket's buffer was taken")
    except ValueError as e:
        assert "is not a contiguous view of its parameter's shape" in str(e), str(e)
    if rank == 0:
        print(f"cast and resized in place: relative errors {max(cast):.3f} (bf16), "
              f"{max(grown):.3f} (grown), {max(shrunk):.3f} (shrunk); replicas identical",
              flush=True)


def test_buckets_gift_cannot_send_are_refused_by_name(rank, world):
    """Sparse gradients (an nn.Embedding(sparse=True)) and float64 ones: every rank raises
    an error that names the hook and the bucket, where the sparse one failed on a data
    pointer and the float64 one on an unknown plan dtype."""
    def raised(run):
        try:
            run()
        except (ValueError, RuntimeError) as e:
            return str(e)
        raise AssertionError("the bucket was taken")

    params = [nn.Parameter(torch.empty(8, 16, dtype=torch.float64))]
    said = raised(lambda: gift.ddp.gift_hook(gift.ddp.GiftState(),
                                             Bucket(params, rank, torch.float64)))
    assert "gift_hook: a bucket of torch.float64 gradients" in said, said
    ddp = DDP(nn.Embedding(10, 4, sparse=True))
    ddp.register_comm_hook(gift.ddp.GiftState(), gift.ddp.gift_hook)
    said = raised(lambda: ddp(torch.tensor([1, 2, 3])).sum().backward())
    assert "gift_hook: a bucket of sparse torch.float32 gradients" in said, said
    if rank == 0:
        print("sparse and float64 buckets refused by name", flush=True)


def test_package_on_torch_tensors(rank, world):
    """The package's torch side (one process): outputs written through their address count
    as in-place changes for autograd, and one that requires grad is refused; dtype given as
    torch, NumPy or a name alike; a plan's tensors checked by shape, not only by bytes."""
    if rank != 0:
        return
    x = torch.randn(8, 64)
    frame = gift.encode({"x": x})
    w = torch.randn(8, 64, requires_grad=True)
    y = w * 2
    z = y.sin()  # saves y for its backward
    with gift.open(frame) as f:
        f.decode("x", out=y.detach())
        try:
            f.decode("x", out=w)
            raise AssertionError("a tensor that requires grad was written")
        except ValueError as e:
            assert "requires grad; gift writes it outside autograd" in str(e), str(e)
    try:
        z.sum().backward()
        raise AssertionError("backward used values gift overwrote")
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e), str(e)
    with torch.inference_mode():
        made = torch.empty(8, 64)
    with gift.open(frame) as f:  # an inference tensor has no version to count: still taken
        assert torch.equal(f.decode("x", out=made), gift.decode(frame, device="cpu")["x"])
    for dtype in (torch.float16, "float16"):
        got = gift.decode(frame, device="cpu", dtype=dtype)["x"]
        assert got.dtype == torch.float16, got.dtype
        codes, scales = gift.encode_tensor(x)
        assert gift.decode_tensor(codes, scales, dtype=dtype).dtype == torch.float16
    plan = gift.ReducePlan(1, 0, [("w", "float32", (4, 128))], coords="euclidean")
    try:
        plan.encode_shards([torch.zeros(128, 4)])
        raise AssertionError("a tensor of another shape (the same bytes) was taken")
    except ValueError as e:
        assert "float32 (128, 4), the plan has float32 (4, 128)" in str(e), str(e)
    print("package on torch tensors: autograd sees the writes, dtypes and shapes checked",
          flush=True)


def test_uneven_inputs_with_join(rank, world):
    model = new_model("mlp")
    ddp = DDP(model)
    state = gift.ddp.GiftState()
    ddp.register_comm_hook(state, gift.ddp.gift_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with ddp.join():
        for step in range(6 + 3 * rank):
            x, y = batch("mlp", rank, step)
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    check_replicas(model, world, "after join()")
    assert torch.isfinite(flat_params(model)).all()
    if rank == 0:
        print(f"join: {6 + 3 * (world - 1)} steps on the last rank, replicas identical",
              flush=True)


def test_a_process_group_of_some_ranks(rank, world):
    # DDP over ranks 1..world-1 only, in GIFT coordinates: the group's rank 0, global rank 1,
    # fits the basis and broadcasts it, and every exchange is on the group alone; rank 0 takes
    # no part. Against fp32 DDP on the group.
    if world < 3:
        return
    group = dist.new_group(list(range(1, world)))  # on every rank, as torch requires
    if rank == 0:
        return
    members = world - 1

    def run(state):
        model = new_model("mlp")
        ddp = DDP(model, process_group=group)
        if state is not None:
            state.attach(ddp)
            ddp.register_comm_hook(state, gift.ddp.gift_hook)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for step in range(STEPS):
            x, y = batch("mlp", rank, step)
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        every = [torch.empty_like(flat) for _ in range(members)]
        dist.all_gather(every, flat, group=group)
        assert all(torch.equal(every[0], f) for f in every), "replicas differ in the group"
        loss = loss.detach().clone()
        dist.all_reduce(loss, group=group)
        return loss.item() / members

    ref = run(None)
    state = gift.ddp.GiftState(process_group=group, coords="auto", refresh_every=10)
    got = run(state)
    assert abs(got - ref) <= 0.02 * ref, f"group of {members}: loss {got} against fp32's {ref}"
    assert state.bytes_sent > 0 and state.basis is not None
    if rank == 1:
        print(f"group of ranks 1..{world - 1}: loss {got:.5f} against fp32's {ref:.5f}",
              flush=True)


def test_overflow_skips_the_step_everywhere(rank, world):
    ddp_harness.check_overflow_skips_the_step(
        rank, world, lambda: DDP(new_model("mlp")), lambda step: batch("mlp", rank, step),
        lambda model: model.net[2].bias)


def _check_failure_on_the_last_rank_fails_every_rank(rank, world, state, method, error,
                                                    others_say, what):
    """Replaces `method` of the last rank's plans with one raising `error` at step 2: every
    rank must raise at that step, the last with its own error and the others saying
    `others_say`, instead of leaving the others in the next exchange."""
    model = new_model("mlp")
    ddp = DDP(model)
    ddp.register_comm_hook(state, gift.ddp.gift_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def failing(*args, **kwargs):
        raise error

    for step in range(4):
        if step == 2 and rank == world - 1:
            for plan in state._plans.values():
                setattr(plan, method, failing)
        x, y = batch("mlp", rank, step)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        try:
            loss.backward()
        except RuntimeError as e:  # DDP may wrap the hook's GiftError
            want = error.message if rank == world - 1 else others_say
            assert step == 2 and want in str(e), f"step {step}: {e}"
            if rank == 0:
                print(f"{what}: every rank raised at the step it happened", flush=True)
            return
        opt.step()
    raise AssertionError(f"{what} went unnoticed")


def test_status_error_fails_every_rank(rank, world):
    """A plan's status error on the last rank (what a device plan reports for a misrouted
    message, stood in for here) raises on every rank at that step's last bucket, naming the
    rank."""
    _check_failure_on_the_last_rank_fails_every_rank(
        rank, world, gift.ddp.GiftState(), "status",
        gift.GiftError(7, "corrupt input", "a misrouted message"),
        f"rank {world - 1} failed at the end of step 2", "status error")


def test_step_failed_on_one_rank_fails_every_rank(rank, world):
    """A host step that fails on one rank only (what a message corrupted on its way there
    gives, stood in for here) raises on every rank in that bucket, the others naming the rank
    (its remaining messages say it abandoned the call)."""
    if world < 2:
        return
    _check_failure_on_the_last_rank_fails_every_rank(
        rank, world, gift.ddp.GiftState(coords="euclidean"), "sum_shard",
        gift.GiftError(19, "section checksum mismatch", "a corrupted message"),
        f"rank {world - 1} abandoned call 3", "one rank's failed step")


def test_failed_decode_on_one_rank_fails_every_rank_at_the_step_end(rank, world):
    """A host step 5 that fails on one rank (no exchange follows it to tell the others) raises
    on every rank at that step's last bucket, naming the rank."""
    _check_failure_on_the_last_rank_fails_every_rank(
        rank, world, gift.ddp.GiftState(coords="euclidean"), "decode_result_at",
        gift.GiftError(19, "section checksum mismatch", "a corrupted result"),
        f"rank {world - 1} failed at the end of step 2", "one rank's failed decode")


def test_bad_options_fail_at_construction(rank, world):
    """Options that would fail inside a backward pass, or in rank 0's fit only (leaving the
    others in its broadcast), fail when the state is made."""
    for kwargs, says in ((dict(basis_rank=-1), "basis_rank: -1"),
                         (dict(basis_rank=0), "basis_rank: 0"),
                         (dict(damping=0), "damping: 0 is not a positive number"),
                         (dict(refresh_every=2.5), "refresh_every: 2.5 is not an integer"),
                         (dict(start_iter=-1), "start_iter: -1"),
                         (dict(error_feedback="no"), "error_feedback: 'no'"),
                         (dict(process_group="foo"), "process_group: 'foo' is not a "
                                                     "ProcessGroup")):
        try:
            gift.ddp.GiftState(**kwargs)
        except (ValueError, TypeError) as e:
            assert says in str(e), f"{kwargs}: {e}"
        else:
            raise AssertionError(f"GiftState({kwargs}) was accepted")
    # A NumPy number is a number (refused before as "0.001 is not a positive number").
    assert gift.ddp.GiftState(damping=np.float32(1e-3)).damping == float(np.float32(1e-3))
    assert gift.ddp.GiftState(damping=np.float64(1e-3)).damping == 1e-3


def test_options_that_differ_fail_every_rank(rank, world):
    """Ranks given other options (which would sum bytes encoded by other rules, or wait in
    exchanges the others never start) fail at their first bucket on every rank, naming the
    option and the rank; the same options on every rank go through."""
    if world < 2:
        return
    cases = [("fp8", dict(fp8="e5m2")), ("block", dict(block=64)),
             ("start_iter", dict(start_iter=2)), ("refresh_every", dict(refresh_every=3))]
    for name, odd in cases:
        model = new_model("mlp")
        ddp = DDP(model)
        state = gift.ddp.GiftState(coords="euclidean", **(odd if rank == world - 1 else {}))
        ddp.register_comm_hook(state, gift.ddp.gift_hook)
        x, y = batch("mlp", rank, 0)
        try:
            nn.functional.mse_loss(ddp(x), y).backward()
        except RuntimeError as e:  # DDP wraps the hook's ValueError
            assert f"rank {world - 1}'s {name} differs from rank 0's" in str(e), str(e)
        else:
            raise AssertionError(f"{name} that differs went through")
    model = new_model("mlp")
    ddp = DDP(model)
    ddp.register_comm_hook(gift.ddp.GiftState(coords="euclidean"), gift.ddp.gift_hook)
    x, y = batch("mlp", rank, 0)
    nn.functional.mse_loss(ddp(x), y).backward()
    if rank == 0:
        print("options that differ: every rank raised, naming the option", flush=True)


def test_a_live_state_moved_to_another_world_says_so(rank, world):
    """A live state whose process group changes size fails on every rank, saying what to do;
    it failed inside gloo ("invalid output tensor list") or in a later exchange."""
    if world < 2:
        return
    alone = [dist.new_group([r]) for r in range(world)]  # on every rank, as torch requires
    model = new_model("mlp")
    ddp = DDP(model)
    state = gift.ddp.GiftState(coords="euclidean")
    ddp.register_comm_hook(state, gift.ddp.gift_hook)
    x, y = batch("mlp", rank, 0)
    nn.functional.mse_loss(ddp(x), y).backward()
    state.process_group = alone[rank]
    try:
        nn.functional.mse_loss(ddp(x), y).backward()
    except RuntimeError as e:  # DDP wraps the hook's ValueError
        assert (f"this GiftState served a world of {world}, and its process group now has 1 "
                "ranks; pickle and unpickle it") in str(e), str(e)
    else:
        raise AssertionError("a state moved to a world of 1 went on")
    restored = pickle.loads(pickle.dumps(state))  # the documented route
    restored.process_group = alone[rank]
    solo = DDP(new_model("mlp"), process_group=alone[rank])
    solo.register_comm_hook(restored, gift.ddp.gift_hook)
    nn.functional.mse_loss(solo(x), y).backward()
    if rank == 0:
        print("a live state in another world: every rank raised, naming the way out", flush=True)


def all_tests(rank, world, tmp):
    test_convergence_and_bytes(rank, world, "mlp")
    test_convergence_and_bytes(rank, world, "transformer")
    test_hook_equals_host_plans(rank, world)
    test_hook_equals_host_plans(rank, world, static_graph=True)
    test_hundreds_of_tensors_in_one_call(rank, world)
    test_checkpoint_resumes_bit_for_bit(rank, world, tmp)
    test_checkpoint_of_another_rank_or_world(rank, world, tmp)
    test_frozen_and_cast_parameters(rank, world)
    test_parameters_cast_or_resized_in_place(rank, world)
    test_buckets_gift_cannot_send_are_refused_by_name(rank, world)
    test_package_on_torch_tensors(rank, world)
    test_uneven_inputs_with_join(rank, world)
    test_a_process_group_of_some_ranks(rank, world)
    test_overflow_skips_the_step_everywhere(rank, world)
    test_status_error_fails_every_rank(rank, world)
    test_step_failed_on_one_rank_fails_every_rank(rank, world)
    test_failed_decode_on_one_rank_fails_every_rank_at_the_step_end(rank, world)
    test_bad_options_fail_at_construction(rank, world)
    test_options_that_differ_fail_every_rank(rank, world)
    test_a_live_state_moved_to_another_world_says_so(rank, world)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    ddp_harness.run(all_tests, parser.parse_args().world, deadline_s=300)


if __name__ == "__main__":
    main()
