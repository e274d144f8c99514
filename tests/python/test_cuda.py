#!/usr/bin/env python3
"""The Python package on CUDA tensors against the same calls on the host, in one process.

Asserts: encode_tensor on a CUDA tensor gives the host's codes and scales byte for byte and
decode_tensor on the device the host's values (every layout, kind, scale type, rounding and
input dtype); non-finite input fails on the device as on the host; gift.encode of CUDA
tensors gives the host frame's bytes and gift.decode(..., device="cuda") its values (FP8,
raw and compressed tensors); and a device ReducePlan writes the host plan's message bytes at
every step (world 3 in one process, error feedback, stochastic rounding, mixed dtypes), with
status() reporting non-finite input.

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
        world = 3
        specs = [("w", "float32", (40, 50)), ("b", "float16", (50,)), ("e", "bfloat16", (7, 33))]
        config = dict(rounding="stochastic", seed=5, integrity=False)
        hosts = [gift.ReducePlan(world, r, specs, **config) for r in range(world)]
        devices = [gift.ReducePlan(world, r, specs, device="cuda", **config)
                   for r in range(world)]
        m = hosts[0].message_bytes
        self.assertEqual(devices[0].message_bytes, m)
        for call in range(4):
            inputs = [[sample(shape, getattr(torch, dtype), 100 * call + r)
                       for _, dtype, shape in specs] for r in range(world)]
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
                    self.assertTrue(torch.equal(got.cpu(), want), f"{where}: {name}")
        bad = gift.ReducePlan(1, 0, specs[:1], device="cuda")
        x = [torch.full((40, 50), float("inf"), device="cuda")]
        send = bad.encode_shards(x)
        bad.decode_result(bad.sum_shard(send), x)
        with self.assertRaises(gift.GiftError) as e:
            bad.status()
        self.assertEqual(e.exception.name, "GIFT_ERROR_NONFINITE_INPUT")
        with self.assertRaises(gift.GiftError):
            bad.save_state()
        with self.assertRaises(ValueError):
            bad.encode_shards([torch.zeros(40, 50)])  # a host tensor for a device plan


if __name__ == "__main__":
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    unittest.main(verbosity=2)
