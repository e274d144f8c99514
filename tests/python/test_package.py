#!/usr/bin/env python3
"""The Python package `gift` against giftc: the same input encodes to the same frame bytes
and decodes to the same values; inspection, errors, bases and the all-reduce's local steps.

Usage: test_package.py PATH/TO/giftc (with PYTHONPATH=<build>/python)
"""
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

import gift

GIFTC = None


def sample_tensors(seed=0):
    rng = np.random.default_rng(seed)
    # Sorted names: giftc reads safetensors in name order, and encodes in that order.
    return {
        "a.weight": (rng.standard_normal((64, 256)) * np.logspace(-3, 1, 256)).astype(np.float32),
        "b.bias": rng.standard_normal(64).astype(np.float32),
        "c.weight": rng.standard_normal((32, 96)).astype(np.float16),
    }


class Package(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def giftc(self, *args):
        r = subprocess.run([GIFTC, "-q", *map(str, args)], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

    def giftc_frame(self, tensors, *options):
        save_file(tensors, self.path("in.safetensors"))
        self.giftc("encode", "-f", "-o", self.path("in.gift"), *options, self.path("in.safetensors"))
        with open(self.path("in.gift"), "rb") as f:
            return f.read()

    def test_encode_gives_giftcs_bytes_and_decode_its_values(self):
        t = sample_tensors()
        cases = [
            ({}, []),
            ({"fp8": "e5m2", "scale": "row"}, ["--fp8", "e5m2", "--scale", "row"]),
            ({"scale": "tile:16x32", "scale_dtype": "e8m0", "rounding": "stochastic", "seed": 7},
             ["--scale", "tile:16x32", "--scale-dtype", "e8m0", "--rounding", "stochastic",
              "--seed", "7"]),
            ({"scale": "block:32", "zstd": 3}, ["--scale", "block:32", "--zstd=3"]),
        ]
        for kwargs, options in cases:
            with self.subTest(options=options):
                ours = gift.encode(t, **kwargs)
                self.assertEqual(ours, self.giftc_frame(t, *options))
                self.giftc("decode", "-f", "-o", self.path("out.safetensors"), self.path("in.gift"))
                theirs = load_file(self.path("out.safetensors"))
                got = gift.decode(ours)
                self.assertEqual(list(got), list(t))
                for name in t:
                    self.assertEqual(got[name].dtype, t[name].dtype)
                    np.testing.assert_array_equal(got[name], theirs[name])
                np.testing.assert_array_equal(got["b.bias"], t["b.bias"])  # vectors stay raw

    def test_npy_input_and_inspection(self):
        x = np.random.default_rng(1).standard_normal((48, 200)).astype(np.float32)
        np.save(self.path("g.npy"), x)
        self.giftc("encode", "-f", "--fp8", "e5m2", "-o", self.path("g.gift"), self.path("g.npy"))
        self.giftc("decode", "-f", "-o", self.path("g_out.npy"), self.path("g.gift"))
        ours = gift.encode(x, fp8="e5m2")
        (value,) = gift.decode(ours).values()
        np.testing.assert_array_equal(value, np.load(self.path("g_out.npy")))
        with gift.open(ours) as mine, gift.open(self.path("g.gift")) as theirs:
            (info,) = mine.tensors
            self.assertEqual((info["fp8"], info["scale"], info["scale_dtype"], info["rounding"]),
                             ("e5m2", "block:128", "f32", "nearest"))
            self.assertEqual(info["shape"], (48, 200))
            self.assertEqual(mine.info["producer"], theirs.info["producer"])
            for a, b in zip(mine.codes(0), theirs.codes(0)):
                np.testing.assert_array_equal(a, b)
            self.assertEqual(mine.codes(0)[0].shape, (48, 200))
            mine.verify()

    def test_bf16_and_metadata_and_decoding_in_place(self):
        x = np.random.default_rng(2).standard_normal((16, 64)).astype(ml_dtypes.bfloat16)
        frame = gift.encode({"w": x}, metadata={"step": "12"})
        with gift.open(frame) as f:
            self.assertEqual(f.metadata, {"step": "12"})
            self.assertEqual(f.tensors[0]["dtype"], "bfloat16")
            out = np.zeros((16, 64), np.float32)
            self.assertIs(f.decode("w", out=out), out)
        self.assertEqual(gift.decode(frame)["w"].dtype, ml_dtypes.bfloat16)
        np.testing.assert_allclose(out, x.astype(np.float32), rtol=0.07, atol=1e-3)

    def test_byte_order_scalars_and_names(self):
        """Big-endian arrays are read as their values (the bytes were read as the machine's
        order), and an output in another order is refused; a NumPy scalar keeps shape ();
        a name that is not a string is named."""
        x = sample_tensors()["a.weight"]
        self.assertEqual(gift.encode({"w": x.astype(">f4")}), gift.encode({"w": x}))
        v = np.arange(4, dtype=">f4")
        np.testing.assert_array_equal(gift.decode(gift.encode({"v": v}))["v"], [0, 1, 2, 3])
        with gift.open(gift.encode({"w": x})) as f:
            with self.assertRaisesRegex(ValueError, "byte order '>' is not the machine's"):
                f.decode("w", out=np.empty(x.shape, ">f4"))
        with gift.open(gift.encode({"s": np.float32(3.0)})) as f:
            self.assertEqual(f.tensors[0]["shape"], ())
            self.assertEqual(f.decode("s"), np.float32(3.0))
        with self.assertRaisesRegex(TypeError, "tensor names are strings; 0 is a int"):
            gift.encode({0: x})

        class Fortran:  # an array-like whose array is in column order
            def __array__(self, dtype=None):
                return np.asfortranarray(x, dtype=dtype)

        self.assertEqual(gift.encode({"w": Fortran()}), gift.encode({"w": x}))

    def test_errors_carry_the_librarys_code_and_message(self):
        with self.assertRaises(gift.GiftError) as e:
            gift.decode(b"not a frame at all, not even close" * 4)
        self.assertEqual((e.exception.code, e.exception.name), (10, "GIFT_ERROR_FRAME_MAGIC"))
        self.assertTrue(e.exception.message)
        self.assertEqual(pickle.loads(pickle.dumps(e.exception)).code, 10)
        with self.assertRaises(gift.GiftError) as e:
            gift.encode({"w": np.full((4, 32), np.nan, np.float32)})
        self.assertEqual(e.exception.code, 2)
        self.assertIn("w", e.exception.message)
        with self.assertRaises(ValueError):
            gift.encode(np.zeros((4, 4), np.float32), scale="block:7x")
        with self.assertRaises(ValueError):
            gift.encode(np.zeros((4, 8), np.float32)[:, ::2])

    def test_a_limited_cpu_target_gives_the_same_frame(self):
        t = sample_tensors()
        widest = gift.cpu_target()
        want = gift.encode(t)
        with self.assertRaises(gift.GiftError) as e:
            gift.limit_cpu_target("no-such-set")
        self.assertEqual(e.exception.name, "GIFT_ERROR_INVALID_ARGUMENT")
        names = gift.cpu_targets()
        self.assertEqual(e.exception.message.rsplit(": ", 1)[1].split(), names)
        self.assertIn(widest, names)
        self.assertEqual(gift.cpu_target(), widest)
        with self.assertRaises(TypeError):
            gift.limit_cpu_target(2)
        try:
            for k, name in enumerate(names):
                gift.limit_cpu_target(name.lower())
                self.assertEqual(gift.cpu_target(), names[max(k, names.index(widest))])
                self.assertEqual(gift.encode(t), want, name)
        finally:
            gift.limit_cpu_target(None)
        self.assertEqual(gift.cpu_target(), widest)

    def test_basis_fit_save_load_and_giftcs_bytes_in_gift_coordinates(self):
        rng = np.random.default_rng(3)
        acts = rng.standard_normal((512, 64)) * np.logspace(-2, 1, 64)
        basis = gift.Basis.fit({"a.weight": acts.T @ acts / 512}, rank=8)
        basis.save(self.path("b.giftb"))
        again = gift.Basis.load(self.path("b.giftb"))
        self.assertEqual(again.id, basis.id)
        self.assertEqual(len(basis.id), 32)
        self.assertEqual(pickle.loads(pickle.dumps(basis)).id, basis.id)
        self.assertEqual(basis.entries[0]["name"], "a.weight")
        grad = {"a.weight": (rng.standard_normal((32, 64)) * np.logspace(-2, 1, 64)).astype(
            np.float32)}
        ours = gift.encode(grad, basis=basis, coords="gift")
        self.assertEqual(ours, self.giftc_frame(grad, "--basis", self.path("b.giftb"),
                                                "--coords", "gift"))
        with gift.open(ours) as f:
            self.assertEqual(f.tensors[0]["coords"], "gift")
            self.assertEqual(f.tensors[0]["basis_id"], basis.id)
        with self.assertRaises(gift.GiftError) as e:
            gift.decode(ours)
        self.assertEqual(e.exception.name, "GIFT_ERROR_BASIS_MISSING")
        np.testing.assert_allclose(gift.decode(ours, basis=again)["a.weight"], grad["a.weight"],
                                   atol=0.15 * np.abs(grad["a.weight"]).max())

    def test_a_nul_in_a_name_key_or_path_is_refused(self):
        # The C API ends a string at its first NUL: "layer\0a" was stored as "layer", and a
        # path "b.giftb\0junk" loaded b.giftb.
        w = np.ones((4, 32), np.float32)
        for call in (lambda: gift.encode({"layer\0a": w}),
                     lambda: gift.encode({"w": w}, metadata={"k\0x": "v"}),
                     lambda: gift.encode({"w": w}, metadata={"k": "v\0tail"}),
                     lambda: gift.Basis.fit({"a\0b": np.eye(16)}),
                     lambda: gift.Basis.load(self.path("b.giftb") + "\0junk")):
            with self.assertRaises(ValueError) as e:
                call()
            self.assertIn("holds a NUL character", str(e.exception))
        basis = gift.Basis.fit({"a": np.eye(16)})
        with self.assertRaises(ValueError):
            basis.save(self.path("b.giftb") + "\0junk")
        # A name or key that is not a str is named (it was pybind's signature dump).
        for call, says in ((lambda: gift.encode({"w": w}, metadata={1: "v"}),
                            "metadata keys and values are strings; 1: 'v' is not"),
                           (lambda: gift.Basis.fit({3: np.eye(16)}),
                            "matrix names are strings; 3 is a int")):
            with self.assertRaises(TypeError) as e:
                call()
            self.assertEqual(str(e.exception), says)
        self.assertFalse(os.path.exists(self.path("b.giftb")))

    def test_basis_fit_leaves_out_a_zero_moment(self):
        # A layer that saw no input (its moment zero) failed the whole fit, and with it the DDP
        # hook's first refresh behind a zero-initialised layer; it gets no whitener instead.
        rng = np.random.default_rng(5)
        acts = rng.standard_normal((256, 64))
        basis = gift.Basis.fit({"dead.weight": np.zeros((64, 64)),
                                "live.weight": acts.T @ acts / 256}, rank=4)
        self.assertEqual([e["name"] for e in basis.entries], ["live.weight"])
        grad = {"dead.weight": rng.standard_normal((32, 64)).astype(np.float32),
                "live.weight": rng.standard_normal((32, 64)).astype(np.float32)}
        with gift.open(gift.encode(grad, basis=basis, coords="gift")) as f:
            self.assertEqual([t["coords"] for t in f.tensors], ["euclidean", "gift"])
        self.assertEqual(len(gift.Basis.fit({"dead.weight": np.zeros((64, 64))}).entries), 0)

    def test_encode_tensor_gives_the_frames_codes_and_decode_tensor_its_values(self):
        rng = np.random.default_rng(6)
        tensors = [(rng.standard_normal((33, 200)) * np.logspace(-3, 2, 200)).astype(np.float32),
                   rng.standard_normal((3, 5, 48)).astype(np.float16)]
        cases = [{}, {"fp8": "e5m2", "scale": "row"},
                 {"scale": "tile:16x32", "scale_dtype": "e8m0", "rounding": "stochastic",
                  "seed": 7}]
        for x in tensors:
            for kwargs in cases:
                with self.subTest(dtype=x.dtype.name, options=kwargs):
                    codes, scales = gift.encode_tensor(x, **kwargs)
                    self.assertEqual(codes.shape, x.shape)
                    layout = {k: v for k, v in kwargs.items() if k not in ("rounding", "seed")}
                    with gift.open(gift.encode({"x": x}, **kwargs)) as f:
                        frame_codes, frame_scales = f.codes("x")
                        np.testing.assert_array_equal(codes, frame_codes)
                        np.testing.assert_array_equal(scales, frame_scales)
                        np.testing.assert_array_equal(gift.decode_tensor(codes, scales, **layout),
                                                      f.decode("x", dtype="float32"))
                        out = np.empty(x.shape, np.float16)
                        self.assertIs(gift.decode_tensor(codes, scales, out, **layout), out)
                        np.testing.assert_array_equal(out, f.decode("x", dtype="float16"))
        codes, scales = gift.encode_tensor(tensors[0])
        with self.assertRaises(ValueError):
            gift.decode_tensor(codes, scales[1:])
        with self.assertRaises(ValueError):
            gift.decode_tensor(codes, scales, np.empty((200, 33), np.float32))
        with self.assertRaises(gift.GiftError) as e:
            gift.encode_tensor(np.full((4, 32), np.inf, np.float32))
        self.assertEqual(e.exception.name, "GIFT_ERROR_NONFINITE_INPUT")

    def test_device_buffers_need_a_cuda_build(self):
        # Without a GPU here the binding is called directly: a host plan refuses a stream (a
        # build without CUDA, any device work), and a build without CUDA refuses device plans.
        plan = gift.ReducePlan(1, 0, [("w", "float32", (4, 32))])
        with self.assertRaises(gift.GiftError) as e:
            plan._plan.sum_shard(0, 0, 0)
        self.assertEqual(e.exception.name,
                         "GIFT_ERROR_INVALID_ARGUMENT" if gift.have_cuda else "GIFT_ERROR_DEVICE")
        if not gift.have_cuda:
            config = {"kind": 0, "block": 128, "scale_dtype": 0, "rounding": 0, "seed": 0,
                      "op": 1, "error_feedback": True, "integrity": False, "threads": 0,
                      "coords": 0, "reselect_every": 50}
            with self.assertRaises(gift.GiftError) as e:
                gift._gift.ReducePlan(config, 1, 0, [("w", 0, [4, 32])], True)
            self.assertEqual(e.exception.name, "GIFT_ERROR_DEVICE")
            self.assertIn("without CUDA", e.exception.message)

    def test_reduce_plan_steps_in_one_process(self):
        world = 3
        specs = [("w", "float32", (40, 50)), ("b", np.float16, (50,))]
        plans = [gift.ReducePlan(world, r, specs) for r in range(world)]
        m = plans[0].message_bytes
        rng = np.random.default_rng(4)
        inputs = [[rng.standard_normal((40, 50)).astype(np.float32),
                   rng.standard_normal(50).astype(np.float16)] for _ in range(world)]
        sends = [p.encode_shards(x) for p, x in zip(plans, inputs)]
        recv = [np.concatenate([s[r * m:(r + 1) * m] for s in sends]) for r in range(world)]
        gathered = np.concatenate([p.sum_shard(x) for p, x in zip(plans, recv)])
        for p, x in zip(plans, inputs):
            p.decode_result(gathered, x)  # in place
        for x in inputs[1:]:
            np.testing.assert_array_equal(x[0], inputs[0][0])
            np.testing.assert_array_equal(x[1], inputs[0][1])
        state = plans[0].save_state()
        plans[0].load_state(state)
        with self.assertRaises(gift.GiftError):
            plans[1].load_state(state)
        with self.assertRaises(ValueError):
            plans[0].encode_shards([inputs[0][0]])

    def test_reduce_plan_in_gift_coordinates(self):
        world = 2
        rng = np.random.default_rng(5)
        acts = rng.standard_normal((512, 64)) * np.logspace(-2, 1, 64)
        basis = gift.Basis.fit({"w": acts.T @ acts / 512}, rank=8)
        other = gift.Basis.fit({"w": np.eye(64)}, rank=8)
        specs = [("w", "float32", (40, 64)), ("b", "float32", (64,))]

        def step(plans):
            inputs = [[rng.standard_normal((40, 64)).astype(np.float32),
                       rng.standard_normal(64).astype(np.float32)] for _ in range(world)]
            m = plans[0].message_bytes
            sends = [p.encode_shards(x) for p, x in zip(plans, inputs)]
            recv = [np.concatenate([s[r * m:(r + 1) * m] for s in sends]) for r in range(world)]
            gathered = np.concatenate([p.sum_shard(x) for p, x in zip(plans, recv)])
            for p, x in zip(plans, inputs):
                p.decode_result(gathered, x)
            np.testing.assert_array_equal(inputs[0][0], inputs[1][0])

        plans = [gift.ReducePlan(world, r, specs, coords="gift") for r in range(world)]
        self.assertEqual(plans[0].coords, ["euclidean", "euclidean"])
        for p in plans:
            p.set_basis(basis)
        self.assertEqual(plans[0].coords, ["gift", "euclidean"])  # vectors stay Euclidean
        step(plans)
        state = plans[0].save_state()
        fresh = gift.ReducePlan(world, 0, specs, coords="gift")
        with self.assertRaises(gift.GiftError) as e:
            fresh.load_state(state)  # the basis first
        self.assertEqual(e.exception.name, "GIFT_ERROR_BASIS_MISSING")
        fresh.set_basis(basis)
        fresh.load_state(state)
        plans[1].set_basis(other)
        with self.assertRaises(gift.GiftError) as e:
            step(plans)
        self.assertEqual(e.exception.name, "GIFT_ERROR_BASIS_MISSING")
        self.assertIn("rank 1", e.exception.message)

    def test_frames_are_read_only_from_contiguous_bytes(self):
        data = np.frombuffer(gift.encode(sample_tensors()), dtype=np.uint8)
        for view in (data[::-1], np.repeat(data, 2)[::2]):
            # A view whose bytes are not where a flat read would take them is refused (a
            # reversed one was read past its end), even where its elements are a frame.
            with self.assertRaisesRegex(ValueError, "not C-contiguous"):
                gift.open(view)
        f = gift.open(np.repeat(data, 2)[::2].copy())
        self.assertEqual(len(f.tensors), 3)
        np.testing.assert_array_equal(f.decode(-1), f.decode(2))
        with self.assertRaisesRegex(IndexError, "tensor 3 of a frame of 3"):
            f.decode(3)
        f.close()
        with self.assertRaisesRegex(ValueError, "the frame is closed"):
            f.decode(0)

    def test_bf16_values_do_not_depend_on_ml_dtypes(self):
        frame = gift.encode(sample_tensors())
        with gift.open(frame) as f:
            want = f.decode("a.weight", dtype="bfloat16").astype(np.float32)
            with self.assertRaisesRegex(ValueError, r"shape \(256, 64\), not \(64, 256\)"):
                f.decode("a.weight", out=np.empty((256, 64), np.float32))
        path = self.path("f.gift")
        with open(path, "wb") as out:
            out.write(frame)
        code = ("import sys; sys.modules['ml_dtypes'] = None; import numpy as np, gift; "
                "a = gift.open(sys.argv[1]).decode('a.weight', dtype='bfloat16'); "
                "sys.stdout.buffer.write(a.dtype.name.encode() + b' ' + a.tobytes())")
        r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, check=True)
        name, data = r.stdout.split(b" ", 1)
        self.assertEqual(name, b"float32")
        np.testing.assert_array_equal(np.frombuffer(data, np.float32).reshape(64, 256), want)

    def test_scales_of_another_dtype_are_refused(self):
        x = np.linspace(-3, 3, 4 * 128, dtype=np.float32).reshape(4, 128)
        codes, scales = gift.encode_tensor(x)
        np.testing.assert_array_equal(gift.decode_tensor(codes, scales),
                                      gift.decode_tensor(codes, scales.copy()))
        for wrong in (scales.astype(np.float64)[: scales.size // 2], scales.view(np.int8)):
            with self.assertRaisesRegex(TypeError, "scales: dtype .*; f32 scales are float32"):
                gift.decode_tensor(codes, wrong)

    def test_integer_and_flag_options_are_refused_by_name(self):
        t = sample_tensors()
        for kwargs, error, says in (
                (dict(scale="block:-128"), ValueError, "scale: 'block:-128' is not"),
                (dict(scale="tile:-1x4"), ValueError, "is not tile:RxC"),
                (dict(seed=-1), ValueError, "seed: -1 is not an integer in"),
                (dict(seed=2**64), ValueError, "seed: 18446744073709551616 is not"),
                (dict(keep_nonfinite="no"), TypeError, "keep_nonfinite: 'no' is not True")):
            with self.assertRaisesRegex(error, says, msg=kwargs):
                gift.encode(t, **kwargs)
        specs = [("a", "float32", (4, 8))]
        for kwargs, error, says in (
                (dict(block=-128), ValueError, "block: -128 is not an integer"),
                (dict(reselect_every=-1), ValueError, "reselect_every: -1"),
                (dict(error_feedback="no"), TypeError, "error_feedback: 'no' is not True"),
                (dict(threads=2.5), TypeError, "threads: 2.5 is not an integer")):
            with self.assertRaisesRegex(error, says, msg=kwargs):
                gift.ReducePlan(2, 0, specs, **kwargs)
        with self.assertRaisesRegex(ValueError, "rank: -1 is not an integer"):
            gift.Basis.fit({"w": np.eye(4)}, rank=-1)

    def test_import_loads_no_cublas(self):
        # Only the tests and benchmarks call the whitener's cuBLAS forms; the package must not
        # make every process that imports it load cuBLAS (about 80 ms, 200 MiB of pages).
        code = "import gift; print(open('/proc/self/maps').read())"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True)
        self.assertIn("_gift", r.stdout)
        self.assertNotIn("libcublas", r.stdout)


if __name__ == "__main__":
    GIFTC = sys.argv.pop(1)
    unittest.main(verbosity=2)
