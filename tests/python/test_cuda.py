#!/usr/bin/env python3
"""The Python package on CUDA tensors against the same calls on the host, in one process.

Asserts: encode_tensor on a CUDA tensor gives the host's codes and scales byte for byte and
decode_tensor on the device the host's values (every layout, kind, scale type, rounding and
input dtype); non-finite input fails on the device as on the host; gift.encode of CUDA
tensors gives the host frame's bytes and gift.decode(..., device="cuda") its values (FP8,
raw and compressed tensors); and a device ReducePlan writes the host plan's message bytes at
every step (world 3 in one process, error feedback, stochastic rounding, mixed dtypes), with
status() reporting non-finite input; in GIFT coordinates too (coords "gift" and "auto"),
with the host plans' choice of coordinates and saved state after every call, a state carried
host -> device -> host in the middle of a run, and a rank in another basis reported by
status().

Usage: test_cuda.py (with PYTHONPATH=<build>/python). Exits 77 (skipped) without torch, a
CUDA device, or a libgift built with CUDA; GIFT_REQUIRE_CUDA_DEVICE=1 makes that a failure.
"""
import os
import sys
import unittest

try:
    import torch
except ImportError as e:
    torch = None
    missing = f"torch is not installed ({e})"
import gift

if torch is not None:
    if not gift.have_cuda:
        missing = "libgift was built without CUDA"
    elif not torch.cuda.is_available():
        missing = f"torch {torch.__version__} has no usable CUDA device"
    else:
        missing = None
if missing:
    print(f"SKIPPED: {missing}")
    sys.exit(1 if os.environ.get("GIFT_REQUIRE_CUDA_DEVICE") == "1" else 77)

CASES = [
    {},
    {"fp8": "e5m2", "scale": "row"},
    {"scale": "tensor", "scale_dtype": "e8m0"},
    {"scale": "block:32", "rounding": "stochastic", "seed": 11},
    {"scale": "tile:16x32", "scale_dtype": "e8m0", "rounding": "stochastic", "seed": 7},
]
LAYOUT_KEYS = ("fp8", "scale", "scale_dtype")


def sample(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    # Columns over five decades, so that scales differ from group to group.
    x = torch.randn(shape, generator=g) * torch.logspace(-3, 2, shape[-1])
    return x.to(dtype)


def bits(t):
    """The tensor's bits, so that equal NaNs compare equal."""
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


class Cuda(unittest.TestCase):
    def test_encode_and_decode_tensor_give_the_hosts_bytes_and_values(self):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for shape in ((33, 200), (3, 5, 48), (1000,)):
                x = sample(shape, dtype, seed=len(shape))
                for kwargs in CASES:
                    with self.subTest(dtype=dtype, shape=shape, options=kwargs):
                        codes, scales = gift.encode_tensor(x, **kwargs)
                        d_codes, d_scales = gift.encode_tensor(x.cuda(), **kwargs)
                        self.assertTrue(d_codes.is_cuda and d_scales.is_cuda)
                        self.assertTrue(torch.equal(d_codes.cpu(), codes))
                        self.assertTrue(torch.equal(d_scales.cpu(), scales))
                        layout = {k: v for k, v in kwargs.items() if k in LAYOUT_KEYS}
                        for out in ("float32", "bfloat16", "float16"):
                            want = gift.decode_tensor(codes, scales, dtype=out, **layout)
                            got = gift.decode_tensor(d_codes, d_scales, dtype=out, **layout)
                            self.assertTrue(got.is_cuda)
                            self.assertTrue(torch.equal(got.cpu(), want), out)

    def test_nonfinite_input_fails_on_the_device(self):
        x = torch.randn(8, 256, device="cuda")
        x[3, 17] = float("nan")
        with self.assertRaises(gift.GiftError) as e:
            gift.encode_tensor(x)
        self.assertEqual(e.exception.name, "GIFT_ERROR_NONFINITE_INPUT")
        self.assertIn(str(3 * 256 + 17), e.exception.message)
        codes, _ = gift.encode_tensor(x, keep_nonfinite=True)
        host, _ = gift.encode_tensor(x.cpu(), keep_nonfinite=True)
        self.assertTrue(torch.equal(codes.cpu(), host))

    def test_frames_of_cuda_tensors(self):
        tensors = {"a.weight": sample((64, 256), torch.float32, 1),
                   "b.bias": sample((64,), torch.float32, 2),
                   "c.weight": sample((32, 96), torch.bfloat16, 3)}
        for kwargs in ({}, {"fp8": "e5m2", "scale": "row", "zstd": 3}):
            with self.subTest(options=kwargs):
                frame = gift.encode(tensors, **kwargs)
                self.assertEqual(gift.encode({k: v.cuda() for k, v in tensors.items()},
                                             **kwargs), frame)
                on_host = gift.decode(frame, device="cpu")
                on_device = gift.decode(frame, device="cuda")
                for name, want in on_host.items():
                    self.assertTrue(on_device[name].is_cuda)
                    self.assertTrue(torch.equal(on_device[name].cpu(), want), name)
                with gift.open(frame) as f:
                    out = torch.empty(64, 256, dtype=torch.float16, device="cuda")
                    self.assertIs(f.decode("a.weight", out=out), out)
                    self.assertTrue(torch.equal(out.cpu(), torch.from_numpy(
                        f.decode("a.weight", dtype="float16"))))

    def test_device_plan_writes_the_host_plans_bytes(self):
        self._compare_plans(dict(rounding="stochastic", seed=5, integrity=False))
        # Kept NaN and Inf on two ranks in call 1: the same NaN codes, header flags and
        # results as the host plans, and no residual committed (calls 2 and 3 agree too).
        for fp8 in ("e4m3", "e5m2"):
            self._compare_plans(dict(fp8=fp8, integrity=False, keep_nonfinite=True),
                                nonfinite_call=1)

    def _compare_plans(self, config, nonfinite_call=None):
        world = 3
        specs = [("w", "float32", (40, 50)), ("b", "float16", (50,)), ("e", "bfloat16", (7, 33))]
        hosts = [gift.ReducePlan(world, r, specs, **config) for r in range(world)]
        devices = [gift.ReducePlan(world, r, specs, device="cuda", **config)
                   for r in range(world)]
        m = hosts[0].message_bytes
        self.assertEqual(devices[0].message_bytes, m)
        for call in range(4):
            inputs = [[sample(shape, getattr(torch, dtype), 100 * call + r)
                       for _, dtype, shape in specs] for r in range(world)]
            if call == nonfinite_call:
                inputs[1][0][3, 7] = float("nan")
                inputs[2][1][49] = float("-inf")
            results = []
            for plans, where in ((hosts, "cpu"), (devices, "cuda")):
                values = [[t.to(where, copy=True) for t in x] for x in inputs]
                sends = [p.encode_shards(x) for p, x in zip(plans, values)]
                recv = [torch.cat([s[r * m:(r + 1) * m] for s in sends]) for r in range(world)]
                reduced = [p.sum_shard(x) for p, x in zip(plans, recv)]
                for p, x in zip(plans, values):
                    p.decode_result(torch.cat(reduced), x)
                    p.status()
                results.append((sends, reduced, values))
            (h_sends, h_reduced, h_values), (d_sends, d_reduced, d_values) = results
            for r in range(world):
                where = f"call {call}, rank {r}"
                self.assertTrue(torch.equal(d_sends[r].cpu(), h_sends[r]), f"{where}: messages")
                self.assertTrue(torch.equal(d_reduced[r].cpu(), h_reduced[r]),
                                f"{where}: reduced shard")
                for (name, _, _), want, got in zip(specs, h_values[r], d_values[r]):
                    self.assertTrue(torch.equal(bits(got.cpu()), bits(want)), f"{where}: {name}")
            if call == nonfinite_call:
                w, b = h_values[0][0], h_values[0][1]
                self.assertEqual((~torch.isfinite(w)).nonzero().tolist(), [[3, 7]])
                self.assertTrue(w[3, 7].isnan())
                self.assertEqual((~torch.isfinite(b)).nonzero().reshape(-1).tolist(), [49])
                if config["fp8"] == "e5m2":
                    self.assertEqual(b[49].item(), float("-inf"))
                else:
                    self.assertTrue(b[49].isnan())
        if nonfinite_call is not None:
            return
        bad = gift.ReducePlan(1, 0, specs[:1], device="cuda")
        x = [torch.full((40, 50), float("inf"), device="cuda")]
        send = bad.encode_shards(x)
        bad.decode_result(bad.sum_shard(send), x)
        with self.assertRaises(gift.GiftError) as e:
            bad.status()
        self.assertEqual(e.exception.name, "GIFT_ERROR_NONFINITE_INPUT")
        self.assertEqual(len(bad.save_state()), len(gift.ReducePlan(1, 0, specs[:1]).save_state()))
        with self.assertRaises(ValueError):
            bad.encode_shards([torch.zeros(40, 50)])  # a host tensor for a device plan


# A matrix whose rows share four directions (whitening pays), an isotropic one and a vector.
COORDS_SPECS = [("w", "float32", (48, 64)), ("iso", "float32", (16, 64)), ("b", "float32", (64,))]


def coords_inputs(rank, call):
    g = torch.Generator().manual_seed(1000 * call + rank)
    mix = torch.randn(4, 64, generator=torch.Generator().manual_seed(3)) / 8
    w = (torch.randn(48, 4, generator=g) * torch.tensor([10.0, 5, 2, 1])) @ mix
    w += 0.01 * torch.randn(48, 64, generator=g)
    return [w, torch.randn(16, 64, generator=g), torch.randn(64, generator=g)]


def coords_basis(seed=3, rank=8):
    mix = torch.randn(4, 64, generator=torch.Generator().manual_seed(seed)) / 8
    w = (torch.randn(512, 4, generator=torch.Generator().manual_seed(9)) *
         torch.tensor([10.0, 5, 2, 1])) @ mix + 0.01 * torch.randn(
        512, 64, generator=torch.Generator().manual_seed(10))
    a = (w.T @ w / 512).double().numpy()
    return gift.Basis.fit({"w": a, "iso": torch.eye(64).double().numpy()}, rank=rank,
                          source="gradients")


def run_call(plans, values, m):
    """One call of `plans` (one per rank) on values[rank], in place; the messages."""
    world = len(plans)
    sends = [p.encode_shards(x) for p, x in zip(plans, values)]
    recv = [torch.cat([s[r * m:(r + 1) * m] for s in sends]) for r in range(world)]
    reduced = [p.sum_shard(x) for p, x in zip(plans, recv)]
    for p, x in zip(plans, values):
        p.decode_result(torch.cat(reduced), x)
        p.status()
    return sends, reduced


class DevicePlansInGiftCoordinates(unittest.TestCase):
    def make(self, world, where, basis, **config):
        device = "cuda" if where == "cuda" else None
        plans = [gift.ReducePlan(world, r, COORDS_SPECS, device=device, **config)
                 for r in range(world)]
        for p in plans:
            p.set_basis(basis)
        return plans

    def test_device_plans_give_the_host_plans_bytes_coordinates_and_states(self):
        world = 2
        basis = coords_basis()
        for coords in ("gift", "auto"):
            config = dict(coords=coords, reselect_every=2, integrity=False, op="avg",
                          rounding="stochastic", seed=3)
            hosts = self.make(world, "cpu", basis, **config)
            devices = self.make(world, "cuda", basis, **config)
            m = hosts[0].message_bytes
            for call in range(5):
                where = f"{coords}, call {call}"
                inputs = [coords_inputs(r, call) for r in range(world)]
                h_values = [[t.clone() for t in x] for x in inputs]
                d_values = [[t.cuda() for t in x] for x in inputs]
                h_sends, h_reduced = run_call(hosts, h_values, m)
                d_sends, d_reduced = run_call(devices, d_values, m)
                for r in range(world):
                    self.assertTrue(torch.equal(d_sends[r].cpu(), h_sends[r]), f"{where}: messages")
                    self.assertTrue(torch.equal(d_reduced[r].cpu(), h_reduced[r]),
                                    f"{where}: reduced shard")
                    for (name, _, _), want, got in zip(COORDS_SPECS, h_values[r], d_values[r]):
                        self.assertTrue(torch.equal(got.cpu(), want), f"{where}: {name}")
                    self.assertEqual(devices[r].coords, hosts[r].coords, f"{where}: coords")
                    self.assertEqual(devices[r].save_state(), hosts[r].save_state(),
                                     f"{where}: saved state")
            self.assertEqual(hosts[0].coords[0], "gift", coords)

    def test_state_travels_host_to_device_to_host(self):
        world = 2
        basis = coords_basis()
        config = dict(coords="auto", reselect_every=2, integrity=False, op="avg")
        ref = self.make(world, "cpu", basis, **config)
        m = ref[0].message_bytes
        want = []
        for call in range(4):
            values = [coords_inputs(r, call) for r in range(world)]
            want.append(run_call(ref, values, m) + (values,))
            if call == 1:
                states = [p.save_state() for p in ref]
        devices = self.make(world, "cuda", basis, **config)
        for p, s in zip(devices, states):
            p.load_state(s)
        values = [[t.cuda() for t in coords_inputs(r, 2)] for r in range(world)]
        sends, reduced = run_call(devices, values, m)
        for r in range(world):
            self.assertTrue(torch.equal(sends[r].cpu(), want[2][0][r]), "call 3 on the device")
            for got, expect in zip(values[r], want[2][2][r]):
                self.assertTrue(torch.equal(got.cpu(), expect), "call 3's result")
        hosts = self.make(world, "cpu", basis, **config)
        for p, d in zip(hosts, devices):
            p.load_state(d.save_state())
        values = [coords_inputs(r, 3) for r in range(world)]
        sends, reduced = run_call(hosts, values, m)
        for r in range(world):
            self.assertTrue(torch.equal(sends[r], want[3][0][r]), "call 4 back on the host")
            for got, expect in zip(values[r], want[3][2][r]):
                self.assertTrue(torch.equal(got, expect), "call 4's result")

    def test_a_rank_in_another_basis_is_reported_by_status(self):
        config = dict(coords="gift", integrity=False)
        a = self.make(2, "cuda", coords_basis(), **config)
        b = self.make(2, "cuda", coords_basis(seed=4), **config)
        m = a[0].message_bytes
        values = [[t.cuda() for t in coords_inputs(r, 0)] for r in range(2)]
        s0 = a[0].encode_shards(values[0])
        s1 = b[1].encode_shards(values[1])
        a[0].sum_shard(torch.cat([s0[:m], s1[:m]]))
        with self.assertRaises(gift.GiftError) as e:
            a[0].status()
        self.assertEqual(e.exception.name, "GIFT_ERROR_BASIS_MISSING")
        self.assertIn("from rank 1", str(e.exception))


if __name__ == "__main__":
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    unittest.main(verbosity=2)
