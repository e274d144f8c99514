#!/usr/bin/env python3
"""gift.ddp.gift_hook in GIFT coordinates: 2 CPU processes on gloo.

An MLP whose first Linear sees strongly anisotropic inputs (a few large directions), with
coords="auto" and a basis refit every 10 of 30 steps. Asserts: parameters bit-identical on
every rank after every step, the basis and the choice of coordinates the same on every rank,
some weight in GIFT coordinates at the end (the measured choice follows the gradients: the
first Linear's weight is whitened after the first fit, a hidden one after the later fits),
the final loss within 2% of the fp32 all-reduce's;
a run checkpointed mid-way (basis and choice of coordinates in the pickled state) continuing
bit for bit; a rank holding another basis failing every rank with the same error
instead of hanging (the harness gives up after a deadline); an overflow in one rank's
activations at a refresh step skipping that refit on every rank; and a fit that fails on
rank 0 failing every rank.

Usage: test_ddp_coords.py (with PYTHONPATH=<build>/python). Exits 77 (skipped) without torch.
"""
import os
import pickle
import sys
import time
import warnings

try:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError as e:
    print(f"SKIPPED: the DDP hook tests need torch ({e}); scripts/setup.sh installs python3-torch")
    sys.exit(77)

import ddp_harness
import gift.ddp
from ddp_harness import flat_params

WORLD = 2
STEPS = 30
DEADLINE_S = 120


class Mlp(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, width), nn.Tanh(), nn.Linear(width, width),
                                 nn.Tanh(), nn.Linear(width, 8))

    def forward(self, x):
        return self.net(x)


def mixing():
    """Inputs x = z S Q: four directions 30x larger than the other 60, in a rotated frame
    (so that no single input column carries them), where whitening pays."""
    g = torch.Generator().manual_seed(7)
    q, _ = torch.linalg.qr(torch.randn(64, 64, generator=g))
    s = torch.ones(64)
    s[:4] = 30.0
    return s[:, None] * q


def batch(rank, step, mix):
    g = torch.Generator().manual_seed(1000 * step + rank)
    # Rows enough for the sampled moment to find the large directions (64 would not be).
    x = torch.randn(256, 64, generator=g) @ mix
    w = torch.linspace(-1, 1, 64 * 8).reshape(64, 8) / 30
    return x, torch.tanh(x @ w)


def new_model(width=128):
    torch.manual_seed(0)
    return Mlp(width)


def train(rank, state, steps, model=None, opt=None):
    """Trains with `state` (None: DDP's default fp32 all-reduce), comparing replicas after
    every step; returns the last loss over all ranks, the model and the optimizer."""
    mix = mixing()
    model = model or new_model()
    ddp = DDP(model)
    if state is not None:
        state.attach(ddp)
        ddp.register_comm_hook(state, gift.ddp.gift_hook)
    opt = opt or torch.optim.Adam(model.parameters(), lr=3e-3)
    loss = ddp_harness.train_steps(ddp, model, opt, steps, lambda step: batch(rank, step, mix),
                                   WORLD, "")
    return loss, model, opt


def test_auto_coords(rank):
    start = time.time()
    ref, _, _ = train(rank, None, range(STEPS))
    state = gift.ddp.GiftState(coords="auto", refresh_every=10)
    got, _, _ = train(rank, state, range(STEPS))
    coords = state.tensor_coords()
    seen = [None] * WORLD
    dist.all_gather_object(seen, (state.basis.id, coords))
    assert all(s == seen[0] for s in seen), f"ranks differ in basis or coordinates: {seen}"
    assert "gift" in coords.values(), f"no weight ends in GIFT coordinates: {coords}"
    assert all(coords[n] == "euclidean" for n in coords if n.endswith(".bias")), coords
    if rank == 0:
        print(f"auto: final loss fp32 {ref:.5f}, gift {got:.5f} ({got / ref - 1:+.2%}); "
              f"coords {coords}; {time.time() - start:.1f} s", flush=True)
    assert abs(got - ref) <= 0.02 * ref, f"loss {got} against fp32's {ref}"


def test_checkpoint_with_basis(rank, tmp):
    # 1.2 MB of parameters: DDP starts each wrapper with one bucket and rebuilds it into two
    # (the first of 1 MB), so the resumed run's first step is regrouped into the saved plans.
    config, width = dict(coords="auto", refresh_every=5), 512
    _, model, _ = train(rank, gift.ddp.GiftState(**config), range(14), new_model(width))
    expected = flat_params(model)

    state = gift.ddp.GiftState(**config)
    _, model, opt = train(rank, state, range(8), new_model(width))
    assert len(state._plans) == 2, f"{len(state._plans)} plans, not one per rebuilt bucket"
    assert state.basis is not None
    path = os.path.join(tmp, f"rank{rank}.pt")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "hook": pickle.dumps(state)}, path)
    saved_coords = state.tensor_coords()
    del model, opt, state

    saved = torch.load(path)
    model = new_model(width)
    model.load_state_dict(saved["model"])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    opt.load_state_dict(saved["opt"])
    # Resumed without attach(), the plans would name their tensors by place: refused on every
    # rank, whether some ranks attached or none did.
    for attached_ranks, says in (({0}, "rank 1's attach() differs from rank 0's"),
                                 (set(), "attach(model) was not called")):
        unattached = pickle.loads(saved["hook"])
        ddp = DDP(new_model(width))
        if rank in attached_ranks:
            unattached.attach(ddp)
        ddp.register_comm_hook(unattached, gift.ddp.gift_hook)
        x, y = batch(rank, 8, mixing())
        try:
            nn.functional.mse_loss(ddp(x), y).backward()
        except RuntimeError as e:  # DDP wraps the hook's ValueError
            assert says in str(e), str(e)
        else:
            raise AssertionError(f"a state with a basis ran unattached on {attached_ranks}")
    state = pickle.loads(saved["hook"])
    _, model, _ = train(rank, state, range(8, 9), model, opt)
    assert [x.group for x in state._layouts.values()] == [False], \
        "the new wrapper's first bucket was not regrouped into the saved plans"
    assert state.tensor_coords() == saved_coords, "the choice of coordinates was not restored"
    _, model, _ = train(rank, state, range(9, 14), model, opt)
    assert torch.equal(flat_params(model), expected), "the resumed run differs"
    if rank == 0:
        print(f"checkpoint: resumed in basis {state.basis.id} as the uninterrupted run",
              flush=True)


def test_basis_mismatch_fails_every_rank(rank):
    state = gift.ddp.GiftState(coords="auto", refresh_every=3)
    if rank == 1:
        other = gift.Basis.fit({"net.0.weight": torch.eye(64).numpy()}, rank=4)
        state._load_basis = lambda data: other
    try:
        train(rank, state, range(6))
    except RuntimeError as e:  # DDP may wrap the hook's GiftError
        assert "different bases" in str(e) and "rank 1" in str(e), str(e)
        assert state.iter == 0, f"failed at step {state.iter}, not at the first refresh"
        if rank == 0:
            line = next(x for x in str(e).splitlines() if "different bases" in x)
            print(f"mismatch: every rank raised {type(e).__name__}: {line.strip()}", flush=True)
        return
    raise AssertionError("a rank in another basis trained on")


def test_overflowing_activations_skip_the_refresh(rank):
    """An Inf in the last rank's input at a refresh step: every rank skips that refit alike
    (no basis yet after it, no rank left waiting), the step's gradients reach every rank
    non-finite and the step is skipped; the next refresh fits one basis everywhere."""
    mix = mixing()
    model = new_model()
    ddp = DDP(model)
    state = gift.ddp.GiftState(coords="auto", refresh_every=3)
    state.attach(ddp)
    ddp.register_comm_hook(state, gift.ddp.gift_hook)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(4):
        x, y = batch(rank, step, mix)
        if step == 0 and rank == WORLD - 1:
            x[5, 7] = float("inf")
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        finite = all(torch.isfinite(p.grad).all() for p in model.parameters())
        assert finite == (step != 0), f"step {step}: gradients finite: {finite}"
        if finite:
            opt.step()
        ddp_harness.check_replicas(model, WORLD, f"overflow at a refresh, step {step}")
        if step == 0:
            assert state.basis is None, "a basis was fitted to non-finite statistics"
    ids = [None] * WORLD
    dist.all_gather_object(ids, state.basis.id if state.basis is not None else None)
    assert ids[0] is not None and all(i == ids[0] for i in ids), f"bases after step 3: {ids}"
    if rank == 0:
        print("overflow at a refresh: skipped on every rank, the next refresh fitted one basis",
              flush=True)


def test_failed_fit_fails_every_rank(rank):
    """Rank 0's fit fails, with a GiftError or any other exception: every rank raises, none
    waits in the broadcast of the basis."""
    fit = gift.ddp.Basis.__dict__["fit"]  # the classmethod itself, to put back
    for failure in (gift.GiftError(1, "invalid argument", "rank is 0"),
                    MemoryError("no memory for the fit")):
        def failing_fit(*args, **kwargs):
            raise failure
        if rank == 0:
            gift.ddp.Basis.fit = failing_fit
        state = gift.ddp.GiftState(coords="auto", refresh_every=3)
        try:
            train(rank, state, range(2))
        except (RuntimeError, MemoryError) as e:  # DDP may wrap the hook's error
            want = str(failure) if rank == 0 else "rank 0 could not fit the basis"
            assert want in str(e), str(e)
        else:
            raise AssertionError(f"a failed fit ({failure!r}) went unnoticed")
        finally:
            gift.ddp.Basis.fit = fit
    if rank == 0:
        print("failed fit: every rank raised", flush=True)


class Mixed(nn.Module):
    """Linears attach() must pass over: a frozen one, a weight-normed one (its weight is
    computed from two parameters), and one called by keyword (unseen by a forward pre-hook
    before torch 2.0); the last Linear is plain."""

    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(64, 64).requires_grad_(False)
        self.normed = nn.utils.weight_norm(nn.Linear(64, 64))
        self.keyword = nn.Linear(64, 64)
        self.plain = nn.Linear(64, 8)

    def forward(self, x):
        return self.plain(torch.tanh(self.keyword(input=self.normed(self.frozen(x)))))


def test_attach_passes_over_linears_it_cannot_serve(rank):
    """attach() collected for frozen Linears too (a d x d moment each for the whole run),
    failed with a KeyError on a parametrized weight, and a Linear called by keyword failed
    the forward (IndexError in the pre-hook). Now: a warning names the weight-normed one,
    only the trainable plain Linears collect, moments exist only in collection steps, and
    the run fits a basis, identical on every rank."""
    mix = mixing()
    torch.manual_seed(0)
    model = Mixed()
    state = gift.ddp.GiftState(coords="auto", refresh_every=2)
    ddp = DDP(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state.attach(ddp)
    assert any("normed are computed (parametrized)" in str(w.message) for w in caught), caught
    assert sorted(state._moments) == ["keyword.weight", "plain.weight"], sorted(state._moments)
    ddp.register_comm_hook(state, gift.ddp.gift_hook)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ddp_harness.train_steps(ddp, model, opt, range(3), lambda step: batch(rank, step, mix),
                            WORLD, "mixed Linears, ")
    assert state.basis is not None, "no basis was fitted"
    assert all(m[0] is None for m in state._moments.values()), "moments outlived their step"
    names = [e["name"] for e in state.basis.entries]
    assert "plain.weight" in names, names
    ids = [None] * WORLD
    dist.all_gather_object(ids, state.basis.id)
    assert all(i == ids[0] for i in ids), ids
    if rank == 0:
        print(f"attach over mixed Linears: basis of {names}", flush=True)


def all_tests(rank, world, tmp):
    test_auto_coords(rank)
    test_checkpoint_with_basis(rank, tmp)
    test_basis_mismatch_fails_every_rank(rank)
    test_overflowing_activations_skip_the_refresh(rank)
    test_failed_fit_fails_every_rank(rank)
    test_attach_passes_over_linears_it_cannot_serve(rank)


def main():
    ddp_harness.run(all_tests, WORLD, DEADLINE_S)


if __name__ == "__main__":
    main()
