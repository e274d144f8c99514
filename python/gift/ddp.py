"""A PyTorch DDP communication hook: the compressed all-reduce of gift_transport.h.

    state = gift.ddp.GiftState(process_group=None, fp8="e4m3", block=128)
    ddp_model.register_comm_hook(state, gift.ddp.gift_hook)

Per bucket and step, every rank encodes its bucket into one FP8 message per rank
(ReducePlan.encode_shards), the messages cross with all_to_all_single, each rank sums its
shard in rank order and encodes it once (sum_shard), the reduced shards cross with
all_gather and every rank decodes the same bytes into the bucket in place (decode_result).
So every rank ends each step with bit-identical gradients, each value is rounded to FP8
twice whatever the world size (one process included), and a rank sends about
2 (N-1)/N x 1.03 bytes per element against 2 (N-1)/N x 4 for fp32. The algorithm is
libgift's; this module only moves bytes, on any process group with all_to_all_single and
all_gather on uint8 tensors where the bucket is: CPU buckets through host plans (gloo), CUDA
buckets through device plans (gift_transport_cuda.h; NCCL, or gloo), whose steps and the
collectives are enqueued on the current stream and write the host plans' message bytes.

A plan serves one bucket of the layout DDP settles on (each bucket one binding call per
step). DDP starts every wrapper with provisional buckets (all parameters in one, unless it
looks for unused parameters) and rebuilds them in gradient-ready order after its first step
(its second with static_graph): the plans follow until a layout has served two whole steps
after the one it appeared in. From then on they stay, a checkpoint's plans too, so that a
run resumed in a new wrapper, whose first step has the provisional buckets again, sends what
the uninterrupted run sends: a bucket of another layout hands its gradients to the plans
they belong to, a plan runs once all of its gradients are in, and a bucket's future
completes once all of its plans ran (by the step's last bucket, before DDP waits for them).
Plans that can no longer fill (parameters frozen since, or cast to another dtype) give way
to new ones at the step's last bucket, and the plans follow DDP's layout again.

The hook returns the average (the sum divided by the world size, as DDP's default hook); the
collectives run inside the hook (for CUDA buckets, enqueued on the current stream, which the
future carries). Non-finite gradients travel as through DDP's own all-reduce: every rank
ends the step with a NaN (or Inf) wherever a rank had one (across the row, for a weight in
GIFT coordinates), so that a loss scaler (GradScaler) sees the overflow on every rank and
skips the step everywhere; the plan of the bucket that held it keeps its error feedback and
choice of coordinates as they were (ReducePlan's keep_nonfinite), the other buckets' plans
keep the step's residuals (one FP8 rounding error of gradients the step did not apply).
Device plans report what else their data held (messages of another call or basis) once per
step, at the last bucket, which waits for the device; the error is raised there on every
rank (one small all_gather per step agrees on it). A host plan's step 1 or 3 that fails on
one rank (a message that fails its checksum, say) fails that bucket on every rank: the
rank's remaining messages say so (ReducePlan.abandon), and the others raise
GIFT_ERROR_REMOTE naming it. Its step 5 failing (the result corrupted on its way to it, a
dump) raises on every rank at the step's last bucket, the others having decoded that bucket
and kept its error feedback: resume such a run from a checkpoint.

GIFT coordinates (coords="auto" or "gift"): state.attach(model) puts a forward pre-hook on
every nn.Linear, which every refresh_every steps accumulates the second moment X^T X / n of
the layer's input. At the end of such a step the moments are averaged over the ranks, rank 0
fits a basis (a whitener per Linear weight, named as the bucket's parameter) and broadcasts
it, and every bucket's plan takes it from the next step; with "auto" each weight then travels
whitened where the transport's measurement says it helps, decided for all ranks at once.
Until the first basis, and for coords="euclidean", buckets travel in Euclidean coordinates.
CUDA buckets do the same through device plans, with the host plans' bytes: the moments are
collected on the model's device and cross the process group where its backend wants them
(on the current CUDA device for NCCL, on the host otherwise), and the GiftState pickles
with the device plans' states, which load into host or device plans alike.
"""
import math
import numbers
import warnings
import zlib

import torch
import torch.distributed as dist

from . import _DTYPES, Basis, GiftError, ReducePlan, _gift, _int

__all__ = ["GiftState", "gift_hook"]


class GiftState:
    """What the hook keeps between steps: one ReducePlan per bucket of the layout DDP settles
    on (its error feedback and call counter), the basis, the step count and the bytes counted.

    It pickles without its process group (a restored state uses the default group, or the one
    set on `process_group`) and without its forward hooks, so that a run is checkpointed with
    it and resumed bit for bit: each rank saves and restores its own state, and calls
    attach(model) on the restored state again. The basis travels with the state.

    Every rank needs the same options, step count and attach(): at the first bucket a state
    meets (made or unpickled) they are compared over the ranks (one small all_gather), and
    ranks that differ fail there on every rank, naming the option. A live state serves one
    world size: given a process group of another size it fails on every rank (pickle and
    unpickle it to carry it over).

    start_iter: steps of plain fp32 all-reduce before compression starts.
    coords: "auto", "gift" or "euclidean" (see the module's doc); GIFT coordinates need
    attach(model). refresh_every: steps between basis fits (the first on step 0);
    reselect_every: calls between the transport's measurements under "auto" (0: only the
    first call after each fit);
    process_group: None (the default group) or a torch.distributed ProcessGroup;
    basis_rank, damping: how each whitener is fitted (gift.Basis.fit).
    integrity: checksums over every message; None (the default) has them on CPU buckets,
    and not on CUDA buckets, whose device plans have none. (Integrity is not part of a
    saved state's fingerprint, so a checkpoint of a CPU run resumes on CUDA and back.)
    bytes_sent / fp32_bytes: what this rank sent through the hook (the basis refreshes
    included), and what a ring fp32 all-reduce of the same buckets sends (2 (N-1)/N x 4
    bytes per element).
    """

    def __init__(self, process_group=None, fp8="e4m3", block=128, coords="auto",
                 error_feedback=True, start_iter=0, refresh_every=50, reselect_every=50,
                 basis_rank=32, damping=1e-3, scale_dtype="f32", rounding="nearest", seed=0,
                 integrity=None, threads=0):
        # Checked here, before the first step, so that a bad option fails on every rank at
        # once instead of inside a backward pass (or, for the fit's, on rank 0 only).
        start_iter = _int("start_iter", start_iter, high=2**63 - 1)
        refresh_every = _int("refresh_every", refresh_every, low=1, high=2**63 - 1)
        basis_rank = _int("basis_rank", basis_rank, low=1)
        if not (isinstance(damping, numbers.Real) and not isinstance(damping, bool)
                and 0 < damping < math.inf):
            raise ValueError(f"damping: {damping!r} is not a positive number")
        damping = float(damping)
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            raise TypeError(f"process_group: {process_group!r} is not a ProcessGroup (or None)")
        self.process_group = process_group
        self.config = dict(fp8=fp8, block=block, scale_dtype=scale_dtype, rounding=rounding,
                           seed=seed, op="avg", error_feedback=error_feedback,
                           integrity=integrity, threads=threads, coords=coords,
                           reselect_every=reselect_every, keep_nonfinite=True)
        self.coords = coords
        self.start_iter = start_iter
        self.refresh_every = refresh_every
        self.basis_rank = basis_rank
        self.damping = damping
        self.basis = None
        self.iter = 0
        self.bytes_sent = 0
        self.fp32_bytes = 0
        self._groups = []  # plan keys, in the order met (see _layout)
        self._quiet = 0  # whole steps since the groups last changed; settled at 2
        self._saved = {}  # plan states restored from a checkpoint, until their plan exists
        self._saved_at = None  # (world, rank) of the plans whose states it saves
        self._transient()
        self._unpicklable()
        ReducePlan(1, 0, [], **self.config)

    def _unpicklable(self):
        self._names = {}    # id(parameter) -> its name in the model given to attach
        # weight name -> [sum of x x^T (None until an input comes), rows, d_in] of the step
        # being collected
        self._moments = {}
        self._hooks = []

    def _transient(self):
        self._plans = {}
        self._canon = {}     # (id(parameter), shape) -> its place in the canonical order
        self._param_of = {}  # place -> parameter
        self._shape_of = {}  # place -> the parameter's shape when it took the place
        self._group_of = self._places_of_groups()  # (dtype, place) -> its group's key
        self._layouts = {}   # a bucket's parameters, in bucket order -> _Layout
        self._messages = {}  # plan key -> the plan's message buffers (see _plan)
        self._pending = {}   # plan key -> {place: (bucket buffer, byte offset)} of this step
        self._waiting = []   # [future, buffer, plan keys left] of buckets waiting for plans
        self._regrouped = False  # whether groups came or went in this step
        self._agreed = False  # whether the ranks' options were compared (_agree_on_options)
        self._failure = None  # a host step 5's error, raised at the step's last bucket

    _TRANSIENT = ("process_group", "_plans", "_canon", "_param_of", "_shape_of", "_group_of",
                  "_names",
                  "_moments", "_hooks", "_layouts", "_messages", "_pending", "_waiting",
                  "_regrouped", "_agreed", "_failure")

    def __getstate__(self):
        d = {k: v for k, v in self.__dict__.items() if k not in self._TRANSIENT}
        d["_saved"] = dict(self._saved)
        d["_saved"].update({key: plan.save_state() for key, plan in self._plans.items()})
        return d

    def __setstate__(self, d):
        # States pickled before the plans followed DDP's settled layout: none settled yet.
        d.setdefault("_groups", [])
        d.setdefault("_quiet", 0)
        d.setdefault("_saved_at", None)  # States pickled before it was kept.
        # States pickled before non-finite gradients travelled.
        d["config"].setdefault("keep_nonfinite", True)
        self.__dict__.update(d)
        self.process_group = None
        self._transient()
        self._unpicklable()

    def attach(self, model):
        """Collects the input statistics GIFT coordinates are fitted to: a forward pre-hook on
        every nn.Linear of `model` (the module DDP wraps, or the wrapper) whose weight is a
        parameter that requires grad when attach() is called (frozen ones send no gradient;
        a parametrized weight is computed, and its gradient is not the weight's), and the
        parameter names the basis uses. Call it on every rank, before the first step; with
        coords="euclidean" it only learns the names.

        Memory: a collection step (every refresh_every steps) holds a d_in x d_in fp32 sum
        per Linear where its inputs are, from its first input to the end of the step; then
        one vector of them all crosses the ranks (each sum freed as it is copied in), every
        rank copies it to the host, and rank 0 fits in float64 (python/README.md)."""
        model = getattr(model, "module", model)
        for h in self._hooks:
            h.remove()
        self._unpicklable()
        self._names = {id(p): name for name, p in model.named_parameters()}
        if self.coords == "euclidean":
            return
        computed = []
        for path, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            # The parameter's name, so that Linears sharing a weight share its moment.
            name = self._names.get(id(module.weight))
            if name is None:
                computed.append(path)
                continue
            if not module.weight.requires_grad:
                continue
            self._moments[name] = [None, 0, module.in_features]
            self._hooks.append(_pre_hook(module, lambda args, kwargs, name=name:
                                         self._collect(name, args, kwargs)))
        if computed:
            warnings.warn(f"gift: attach(): the weights of {', '.join(computed)} are computed "
                          "(parametrized), not parameters; they travel in Euclidean coordinates",
                          RuntimeWarning)

    def _collecting(self):
        return bool(self._moments) and self.iter % self.refresh_every == 0

    def _collect(self, name, args, kwargs):
        # Evaluation passes (no_grad) are not the distribution the gradients come from.
        if not (torch.is_grad_enabled() and self._collecting()):
            return
        x = args[0] if args else kwargs.get("input")
        if x is None:  # called by keyword, which a pre-hook sees only from torch 2.0 on
            return
        x = x.detach()
        x = x.reshape(-1, x.shape[-1]).float()
        acc = self._moments[name]
        if acc[0] is None:
            # Where the layer's inputs are, so that collecting them copies nothing.
            acc[0] = torch.zeros(acc[2], acc[2], device=x.device)
        acc[0].addmm_(x.t(), x)
        acc[1] += x.shape[0]

    def _refresh_basis(self, world):
        """Collective, at the end of a collection step: the moments averaged over the ranks
        that saw inputs, the basis fitted on rank 0 and broadcast, its id checked on every
        rank, and set on every plan."""
        group = self.process_group
        comm = self._comm_device()
        names = sorted(self._moments)
        # Each rank's moments, then a 1 per layer that saw inputs: one fp32 all-reduce, into
        # which each sum is divided and then freed, so that the sums and the vector are not
        # held twice over.
        dims = [self._moments[name][2] for name in names]
        flat = torch.zeros(sum(d * d for d in dims) + len(names), device=comm)
        at = 0
        for i, (name, d) in enumerate(zip(names, dims)):
            a, rows, _ = self._moments[name]
            if a is not None:
                flat[at:at + d * d].copy_(a.reshape(-1)).div_(rows)
                flat[-len(names) + i] = 1.0
            self._moments[name] = [None, 0, d]
            at += d * d
        dist.all_reduce(flat, group=group)
        flat = flat.cpu()
        self.bytes_sent += 2 * (world - 1) * flat.numel() * 4 // world
        counts = flat[-len(names):]
        # Activations that overflowed this step: every rank holds the same sums, so every
        # rank skips this refresh alike (the basis stays until the next).
        finite = bool(torch.isfinite(flat).all())
        if not finite and dist.get_rank(group) == 0:
            warnings.warn(f"gift: step {self.iter}: non-finite activation statistics; the "
                          "basis is not refitted this time", RuntimeWarning)
        # The float64 moments for the fit, on rank 0 only.
        moments, at = {}, 0
        for name, d, ranks in zip(names, dims, counts.tolist()):
            if ranks > 0 and dist.get_rank(group) == 0:
                moments[name] = (flat[at:at + d * d].reshape(d, d) / ranks).double().numpy()
            at += d * d
        if not bool((counts > 0).any()) or not finite:
            return
        # The basis' size, or 0 and rank 0's error code: a fit that fails there fails every
        # rank, instead of leaving them in the broadcast below.
        size = torch.zeros(2, dtype=torch.int64, device=comm)
        failure = None
        if dist.get_rank(group) == 0:
            try:
                data = Basis.fit(moments, rank=self.basis_rank, damping=self.damping).to_bytes()
                size[0] = len(data)
            except Exception as e:  # whatever it is, the other ranks must hear of it
                failure = e
                size[1] = e.code if isinstance(e, GiftError) else 5  # GIFT_ERROR_INTERNAL
        dist.broadcast(size, src=self._global_rank(0), group=group)
        size, code = size.cpu().tolist()
        if failure is not None:
            raise failure
        if code:
            raise GiftError(code, _gift.error_string(code),
                            "rank 0 could not fit the basis (its own error says why)")
        if dist.get_rank(group) == 0:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(comm)
        else:
            buf = torch.empty(size, dtype=torch.uint8, device=comm)
        dist.broadcast(buf, src=self._global_rank(0), group=group)
        # As a pipelined broadcast: every rank but the last forwards the bytes once.
        self.bytes_sent += size
        basis = self._load_basis(buf.cpu().numpy().tobytes())
        self._check_same_basis(basis, world)
        self.basis = basis
        for plan in self._plans.values():
            plan.set_basis(basis)

    def _agree_on_options(self, world):
        """At the first bucket a state meets (new or unpickled): what every rank's exchanges
        depend on, all-gathered (one small collective), so that ranks given other options
        (or resumed at other steps, or attached on some ranks only) fail there on every rank,
        naming the option, instead of summing bytes encoded by other rules or waiting in an
        exchange that the others never start."""
        # Unattached, the plans would name their tensors by place: a basis would cover none
        # of them, and saved states would load into plans of other names.
        unattached = self.basis is not None and self.coords != "euclidean" and not self._names
        options = [(k, v) for k, v in sorted(self.config.items()) if k != "threads"]
        options += [("start_iter", self.start_iter), ("refresh_every", self.refresh_every),
                    ("step", self.iter), ("attach()", (bool(self._names), bool(self._moments))),
                    ("basis", self.basis.id if self.basis is not None else None)]
        # Plan states saved at another world size or rank hold another rank's error feedback
        # (or none that fits): where any rank has such, every rank drops its own, so that the
        # plans start alike (their choice of coordinates is in those states too).
        rank = dist.get_rank(self.process_group)
        elsewhere = bool(self._saved) and self._saved_at not in (None, (world, rank))
        mine = torch.tensor([zlib.crc32(repr(v).encode()) for _, v in options] + [elsewhere],
                            dtype=torch.int64, device=self._comm_device())
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=self.process_group)
        every = [t.cpu().tolist() for t in every]
        if any(e[-1] for e in every):
            if rank == 0:
                warnings.warn("gift: the plan states were saved at another world size or rank "
                              "(a rank's checkpoint loaded by another, or an elastic restart): "
                              "every rank drops them, and the plans start without error "
                              "feedback; the basis, step and plan groups stay", RuntimeWarning)
            self._saved = {}
        self._saved_at = (world, rank)
        for r in range(1, world):
            for i, (name, value) in enumerate(options):
                if every[r][i] != every[0][i]:
                    raise ValueError(
                        f"gift_hook: rank {r}'s {name} differs from rank 0's (this rank, "
                        f"{rank}, has {value!r}); every rank "
                        "needs the same GiftState options, step and attach()")
        if unattached:  # on every rank alike, as the options compared equal
            raise ValueError("gift_hook: this state holds a basis but attach(model) was not "
                             "called (call it again after unpickling a state)")
        self._agreed = True

    def _check_status(self, world):
        """The plans' status (what device plans' steps saw: messages of another call or
        basis) and a host plan's failed step 5, agreed over the ranks at the step's last
        bucket: a rank's error raises on every rank, naming it, instead of leaving the others
        in the next step's exchange."""
        error, self._failure = self._failure, None
        for plan in self._plans.values():
            try:
                plan.status()
            except GiftError as e:
                error = error or e
        code = torch.tensor([error.code if error else 0], device=self._comm_device())
        codes = [torch.empty_like(code) for _ in range(world)]
        dist.all_gather(codes, code, group=self.process_group)
        failed = [(r, c) for r, c in enumerate(torch.cat(codes).cpu().tolist()) if c]
        if error is not None:
            raise error
        if failed:
            r, c = failed[0]
            raise GiftError(c, _gift.error_string(c),
                            f"rank {r} failed at the end of step {self.iter} (its own error "
                            "says why)")

    def _global_rank(self, rank):
        group = self.process_group
        if group is None:
            return rank
        # Public from torch 1.13; the private name before it.
        to_global = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
        return to_global(group, rank)

    def _comm_device(self):
        """Where the process group takes the tensors of its collectives: NCCL on the current
        CUDA device, other backends (gloo) on the host."""
        if dist.get_backend(self.process_group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _load_basis(self, data):
        return Basis.from_bytes(data)

    def _check_same_basis(self, basis, world):
        """A broadcast cannot leave ranks with different bases, but the transport would then
        fail only where the messages meet; checking the ids here fails every rank at once,
        with the ids named."""
        mine = torch.frombuffer(bytearray(basis.id_bytes), dtype=torch.uint8)
        mine = mine.to(self._comm_device())
        ids = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(ids, mine, group=self.process_group)
        ids = [i.cpu() for i in ids]
        odd = [r for r, i in enumerate(ids) if not torch.equal(i, ids[0])]
        if odd:
            hexes = ", ".join(f"rank {r}: {bytes(ids[r].tolist())[::-1].hex()}"
                              for r in [0] + odd)
            raise GiftError(22, _gift.error_string(22),
                            f"the ranks hold different bases after the refresh ({hexes})")

    def tensor_coords(self):
        """{parameter name: "gift" or "euclidean"}: how each gradient travels now."""
        return {name: c for plan in self._plans.values()
                for name, c in zip(plan.names, plan.coords)}

    def _layout(self, bucket, buf):
        """Where the bucket's gradients lie in its buffer, and which plans they go to.

        Plans see their gradients in a canonical order, each parameter's place in the first
        layout this state met, and the plans (the groups) are the buckets of the layout DDP
        settles on: see the module's doc. Before the groups settle, a bucket of a new layout
        replaces the groups it overlaps (their plans and error feedback go); after, it is
        regrouped. Parameters never seen make a group of their own. The gradients are views
        into the bucket, so regrouping costs no copy.

        Layouts are kept by the bucket's parameters (whose hash is their identity), its dtype
        and the parameters' shapes, so that a step looks its layout up instead of walking the
        gradients; the state holds those parameters while it lives. A parameter given another
        shape (its .data replaced) takes a new place, as a new parameter would: a group of its
        old place can no longer fill, and goes at the step's last bucket (_salvage). Learned
        on every call, warm-up steps included, so that the first layout is the initial one of
        the wrapper."""
        params = tuple(bucket.parameters())
        seen = (params, buf.dtype, tuple(p.shape for p in params))
        layout = self._layouts.get(seen)
        if layout is None:
            layout = _Layout(self, params, bucket.gradients(), buf)
            if not layout.group and self._quiet < 2:
                dtype, places = layout.key
                self._drop_groups({self._group_of[(dtype, p)] for p in places
                                   if (dtype, p) in self._group_of})
                layout = _Layout(self, params, bucket.gradients(), buf)
            self._layouts[seen] = layout
        return layout

    def _places_of_groups(self):
        return {(key[0], place): key for key in self._groups for place in key[1]}

    def _add_group(self, key):
        self._groups.append(key)
        self._group_of.update(((key[0], place), key) for place in key[1])
        self._regrouped = True

    def _drop_groups(self, gone):
        """Forgets the groups `gone`, with their plans and saved states."""
        self._groups = [key for key in self._groups if key not in gone]
        self._group_of = self._places_of_groups()
        for key in gone:
            for d in (self._plans, self._messages, self._saved, self._pending):
                d.pop(key, None)
        self._layouts = {}  # their pieces named the groups gone
        self._regrouped = True

    def _salvage(self, world, rank):
        """At the step's last bucket, groups still wait for gradients that DDP's buckets no
        longer hold (parameters frozen since the groups settled, say). They
        go, with their plans and error feedback; the gradients that did come travel now, a
        new group per bucket (in bucket order, the same on every rank), and the groups
        follow DDP's layout again until it settles."""
        stuck = {key for w in self._waiting for key in w[2]}
        came = {}
        for key in stuck:
            came.update(self._pending.get(key, {}))
        self._drop_groups(stuck)
        for fut, buf, _ in self._waiting:
            mine = sorted(place for place, (b, _) in came.items() if b is buf)
            key = (str(buf.dtype), tuple(mine))
            self._add_group(key)
            self._run_group(key, world, rank, [came[place] for place in mine])
            fut.set_result(buf)
        self._waiting = []

    def _specs(self, key, dtype):
        """The plan specs of group `key`: (name, dtype, shape) in canonical order. The basis
        names weights as the model does; unattached, names are places."""
        return [(self._names.get(id(self._param_of[place]), f"p{place}"), dtype,
                 self._shape_of[place]) for place in key[1]]

    def _plan(self, key, buf, world, rank):
        """The plan of group `key` and its message buffers: created on first use, zeroed
        once where the bucket is (device plans never write the messages' padding)."""
        plan = self._plans.get(key)
        if plan is None:
            device = buf.device if buf.is_cuda else None
            plan = ReducePlan(world, rank, self._specs(key, buf.dtype), device=device,
                              **self.config)
            if self.basis is not None:
                plan.set_basis(self.basis)
            if key in self._saved:
                plan.load_state(self._saved.pop(key))
            self._plans[key] = plan
            m = plan.message_bytes
            send = torch.zeros(world * m, dtype=torch.uint8, device=buf.device)
            elements = sum(math.prod(self._shape_of[place]) for place in key[1])
            self._messages[key] = (send, torch.zeros_like(send),
                                   torch.zeros(m, dtype=torch.uint8, device=buf.device),
                                   torch.zeros_like(send), elements)
        return plan, self._messages[key]

    def _run_group(self, key, world, rank, parts, addresses=None):
        """One step of group `key`'s plan, its gradients at `parts` ((bucket buffer, byte
        offset) in canonical order; `addresses`, their data pointers, when known), decoded in
        place."""
        group = self.process_group
        buf = parts[0][0]
        plan, (send, recv, reduced, gathered, elements) = self._plan(key, buf, world, rank)
        where = buf.device if buf.is_cuda else None
        if plan.device != where:
            raise ValueError(f"gift_hook: a bucket on {where or 'the host'}, its plan on "
                             f"{plan.device or 'the host'}; a GiftState serves the device it "
                             "met first (pickle it, and unpickle it for the moved model)")
        m = plan.message_bytes
        if addresses is None:
            addresses = [b.data_ptr() + offset for b, offset in parts]
        # A host step that fails on this rank (a message that fails its checksum, say) is
        # raised after the exchanges, whose messages then say so: every rank fails the call,
        # naming this rank, instead of waiting in an exchange it left. Device plans report
        # at the step's last bucket (_check_status).
        failure = None

        def step(run, out):
            nonlocal failure
            if failure is None:
                try:
                    return run()
                except GiftError as e:
                    if where is not None:
                        raise
                    failure = e
            plan.abandon(out)

        step(lambda: plan.encode_shards_at(addresses, send), send)
        dist.all_to_all_single(recv, send, group=group)
        step(lambda: plan.sum_shard(recv, reduced), reduced)
        dist.all_gather(list(gathered.split(m)), reduced, group=group)
        if failure is not None:
            raise failure
        try:
            plan.decode_result_at(gathered, addresses)
        except GiftError as e:
            # A rank that abandoned the call did so in every rank's gathered messages: every
            # rank raises here. Any other failure is this rank's own, and no exchange follows
            # to tell the others (who decoded, and go on to the next bucket): it is raised on
            # every rank at the step's last bucket (_check_status).
            if where is not None or e.name == "GIFT_ERROR_REMOTE":
                raise
            self._failure = self._failure or e
        self.bytes_sent += 2 * (world - 1) * m
        self.fp32_bytes += 2 * (world - 1) * elements * 4 // world

    def _regroup(self, layout, buf, world, rank):
        """A bucket of a later layout: its gradients join their groups' pending parts, each
        group that is then complete runs (in the order the groups were met, the same on
        every rank), and the buckets whose groups all ran are returned."""
        for key, pieces in layout.pieces:
            parts = self._pending.setdefault(key, {})
            for place, offset in pieces:
                parts[place] = (buf, offset)
        ready = [key for key, _ in layout.pieces if len(self._pending[key]) == len(key[1])]
        for key in ready:
            parts = self._pending.pop(key)
            self._run_group(key, world, rank, [parts[place] for place in key[1]])
        done = []
        for w in self._waiting:
            w[2].difference_update(ready)
            if not w[2]:
                done.append(w)
        self._waiting = [w for w in self._waiting if w[2]]
        return done


class _Layout:
    """One bucket layout: its key (dtype and the parameters' canonical places), whether it is
    a group (a plan's bucket) and then the byte offsets in the bucket's buffer of its
    gradients in canonical order; otherwise its pieces, (group key, [(place, byte offset)])
    for each group it holds gradients of, in the order the groups were met."""

    __slots__ = ("key", "group", "offsets", "pieces", "_at")

    def __init__(self, state, params, grads, buf):
        _check_views(params, grads, buf)
        places = [state._canon.setdefault((id(p), tuple(p.shape)), len(state._canon))
                  for p in params]
        for p, place in zip(params, places):
            state._param_of[place] = p
            state._shape_of[place] = tuple(p.shape)
        dtype = str(buf.dtype)
        self.key = (dtype, tuple(sorted(places)))
        new = tuple(sorted(p for p in places if (dtype, p) not in state._group_of))
        if new:
            # Parameters cast to another dtype leave their old groups for good.
            fresh = set(new)
            state._drop_groups({key for (d, p), key in state._group_of.items()
                                if d != dtype and p in fresh})
            state._add_group((dtype, new))
        base = buf.data_ptr()
        at = {place: g.data_ptr() - base for place, g in zip(places, grads)}
        self.group = self.key in state._groups
        self.offsets = [at[place] for place in self.key[1]]
        rank = {key: i for i, key in enumerate(state._groups)}
        keys = sorted({state._group_of[(dtype, place)] for place in places},
                      key=rank.__getitem__)
        self.pieces = [(key, [(place, at[place]) for place in key[1] if place in at])
                       for key in keys]
        self._at = None

    def at(self, buf):
        """A group layout's parts and addresses in `buf` (see GiftState._run_group), the
        addresses kept while DDP keeps the bucket's buffer, so that a step walks no tensor in
        Python. Only integers are kept: a layout DDP no longer uses holds no buffer alive."""
        base = buf.data_ptr()
        if self._at is None or self._at[0] != base:
            self._at = (base, [base + o for o in self.offsets])
        return [(buf, o) for o in self.offsets], self._at[1]


def _pre_hook(module, hook):
    """A forward pre-hook calling hook(args, kwargs): with the keyword arguments where torch
    passes them (2.0 on), else with none."""
    try:
        return module.register_forward_pre_hook(
            lambda module, args, kwargs: hook(args, kwargs), with_kwargs=True)
    except TypeError:
        return module.register_forward_pre_hook(lambda module, args: hook(args, {}))


def _check_views(params, grads, buf):
    """Plans read and write the gradients through raw addresses: each must be a view of its
    parameter's shape within the bucket's buffer, of its dtype."""
    base, end = buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()
    for p, g in zip(params, grads):
        at = g.data_ptr()
        if (g.dtype != buf.dtype or g.shape != p.shape or not g.is_contiguous() or at < base
                or at + g.numel() * g.element_size() > end):
            raise ValueError(f"gift_hook: a gradient of shape {tuple(g.shape)} and dtype "
                             f"{g.dtype} is not a contiguous view of its parameter's shape "
                             f"{tuple(p.shape)} in the bucket's {buf.dtype} buffer")


def _allreduce_fp32(state, buf, world):
    buf.div_(world)
    dist.all_reduce(buf, group=state.process_group)
    fp32 = 2 * (world - 1) * buf.numel() * buf.element_size() // world
    state.bytes_sent += fp32
    state.fp32_bytes += fp32


def gift_hook(state, bucket):
    """The DDP communication hook: averages `bucket` over the ranks through FP8 messages and
    decodes the result into the bucket's own buffer."""
    group = state.process_group
    world = dist.get_world_size(group)
    buf = bucket.buffer()
    if buf.is_sparse or str(buf.dtype).replace("torch.", "") not in _DTYPES:
        # Every rank's bucket is alike: every rank raises here, none waits in an exchange.
        raise ValueError(f"gift_hook: a bucket of {'sparse ' if buf.is_sparse else ''}"
                         f"{buf.dtype} gradients; GIFT sends dense float32, bfloat16 and "
                         "float16 ones (DDP's default hook serves the others)")
    if not state._agreed:
        state._agree_on_options(world)
    elif state._saved_at[0] != world:
        # Every rank sees the new size, so every rank raises here, none waits in an exchange
        # (the plans' shards and error feedback are cut for the old size). A new rank at the
        # same size is not checked here: only the moved ranks would see it, the others would
        # wait for them; the exchange's own checks fail every rank instead ("not shard k").
        raise ValueError(f"gift_hook: this GiftState served a world of {state._saved_at[0]}, "
                         f"and its process group now has {world} ranks; pickle and unpickle "
                         "it to carry it over (its error feedback is then dropped), or make a "
                         "new one")
    layout = state._layout(bucket, buf)
    # A CUDA bucket's future carries the current stream, which the work is enqueued on, to
    # whoever waits for it.
    fut = torch.futures.Future(devices=[buf.device] if buf.is_cuda else None)
    done = [[fut, buf]]
    try:
        if state.iter < state.start_iter:
            _allreduce_fp32(state, buf, world)
        elif layout.group:
            state._run_group(layout.key, world, dist.get_rank(group), *layout.at(buf))
        else:
            state._waiting.append([fut, buf, {key for key, _ in layout.pieces}])
            done = state._regroup(layout, buf, world, dist.get_rank(group))
    except BaseException:
        # The step is abandoned (a failed exchange, say): the next starts afresh.
        state._waiting, state._pending = [], {}
        raise
    for w in done:
        w[0].set_result(w[1])
    if bucket.is_last():
        if state._waiting:
            try:
                state._salvage(world, dist.get_rank(group))
            finally:
                state._waiting, state._pending = [], {}
        state._quiet = min(state._quiet + 1, 2) if not state._regrouped else 0
        state._regrouped = False
        state._check_status(world)
        if state._collecting():
            state._refresh_basis(world)
        state.iter += 1
    return fut
