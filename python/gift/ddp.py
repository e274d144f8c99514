"""A PyTorch DDP communication hook: the compressed all-reduce of gift_transport.h.

    state = gift.ddp.GiftState(process_group=None, fp8="e4m3", block=128)
    ddp_model.register_comm_hook(state, gift.ddp.gift_hook)

Per bucket and step, every rank encodes its bucket into one FP8 message per rank
(ReducePlan.encode_shards), the messages cross with all_to_all_single, each rank sums its
shard in rank order and encodes it once (sum_shard), the reduced shards cross with
all_gather and every rank decodes the same bytes into the bucket in place (decode_result).
So every rank ends each step with bit-identical gradients, each value is rounded to FP8
twice whatever the world size, and a rank sends about 2 (N-1)/N x 1.03 bytes per element
against 2 (N-1)/N x 4 for fp32. The algorithm is libgift's; this module only moves bytes, on
any process group with all_to_all_single and all_gather on uint8 CPU tensors (gloo).

The hook returns the average (the sum divided by the world size, as DDP's default hook), and
its future is already complete: the collectives run inside the hook, since the local steps
between them are CPU work anyway.

Coordinates: the transport has no basis API yet (gift_transport.h), so buckets travel in
Euclidean coordinates; coords="auto" says so and coords="gift" is refused until it has one.
"""
import torch
import torch.distributed as dist

from . import ReducePlan

__all__ = ["GiftState", "gift_hook"]


class GiftState:
    """What the hook keeps between steps: one ReducePlan per bucket (its error feedback and
    call counter), the step count and the bytes counted.

    It pickles without its process group (a restored state uses the default group, or the one
    set on `process_group`), so that a run is checkpointed with it and resumed bit for bit:
    each rank saves and restores its own state.

    start_iter: steps of plain fp32 all-reduce before compression starts.
    bytes_sent / fp32_bytes: what this rank sent through the hook, and what a ring fp32
    all-reduce of the same buckets sends (2 (N-1)/N x 4 bytes per element).
    """

    def __init__(self, process_group=None, fp8="e4m3", block=128, coords="auto",
                 error_feedback=True, start_iter=0, refresh_every=50, scale_dtype="f32",
                 rounding="nearest", seed=0, integrity=True, threads=0):
        if coords not in ("auto", "euclidean", "gift"):
            raise ValueError(f"coords: {coords!r} is not auto, euclidean or gift")
        if coords == "gift":
            raise NotImplementedError(
                "coords='gift': the transport (gift_transport.h) has no basis API yet; "
                "use 'auto' or 'euclidean' (both send Euclidean coordinates for now)")
        self.process_group = process_group
        self.config = dict(fp8=fp8, block=block, scale_dtype=scale_dtype, rounding=rounding,
                           seed=seed, op="avg", error_feedback=error_feedback,
                           integrity=integrity, threads=threads)
        self.coords = coords
        self.start_iter = start_iter
        self.refresh_every = refresh_every
        self.iter = 0
        self.bytes_sent = 0
        self.fp32_bytes = 0
        self._plans = {}
        self._saved = {}  # plan states restored from a checkpoint, until their plan exists
        self._canon = {}  # id(parameter) -> its place in the canonical order (see _plan)
        # Checked here, before the first step, so that a bad option fails on every rank at
        # once instead of inside a backward pass.
        ReducePlan(1, 0, [], **self.config)

    def __getstate__(self):
        d = {k: v for k, v in self.__dict__.items()
             if k not in ("process_group", "_plans", "_canon")}
        d["_saved"] = dict(self._saved)
        d["_saved"].update({key: plan.save_state() for key, plan in self._plans.items()})
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self.process_group = None
        self._plans = {}
        self._canon = {}

    def _places(self, bucket):
        # Learned on every call, warm-up steps included, so that the first layout is the
        # initial one of the wrapper.
        return [self._canon.setdefault(id(p), len(self._canon)) for p in bucket.parameters()]

    def _plan(self, bucket, buf, world, rank):
        """The bucket's plan and its tensors' addresses in the plan's order.

        The plan sees the bucket's gradients in a canonical order, each parameter's place in
        the first layout this state met: DDP rebuilds its buckets in gradient-ready order
        after the first step of every wrapper, and since scale blocks run across tensor
        boundaries, the bytes depend on the order. With it a run resumed in a new wrapper
        (whose first step has the initial layout again) sends what the uninterrupted run
        sends. The gradients are views into the bucket, so reordering costs no copy."""
        places = self._places(bucket)
        grads = bucket.gradients()
        order = sorted(range(len(grads)), key=places.__getitem__)
        key = (str(buf.dtype), tuple(sorted(places)))
        plan = self._plans.get(key)
        if plan is None:
            specs = [(f"p{places[i]}", buf.dtype, tuple(grads[i].shape)) for i in order]
            plan = ReducePlan(world, rank, specs, **self.config)
            if key in self._saved:
                plan.load_state(self._saved.pop(key))
            self._plans[key] = plan
        return plan, [grads[i].data_ptr() for i in order]


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
    if state.iter < state.start_iter or world == 1:
        state._places(bucket)
        _allreduce_fp32(state, buf, world)
    else:
        plan, addresses = state._plan(bucket, buf, world, dist.get_rank(group))
        m = plan.message_bytes
        send = torch.empty(world * m, dtype=torch.uint8)
        plan.encode_shards_at(addresses, send)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        reduced = plan.sum_shard(recv)
        gathered = torch.empty(world * m, dtype=torch.uint8)
        dist.all_gather(list(gathered.split(m)), reduced, group=group)
        plan.decode_result_at(gathered, addresses)
        state.bytes_sent += 2 * (world - 1) * m
        state.fp32_bytes += 2 * (world - 1) * buf.numel() * 4 // world
    if bucket.is_last():
        state.iter += 1
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut
