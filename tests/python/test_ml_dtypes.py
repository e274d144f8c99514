#!/usr/bin/env python3
"""FP8 numerics of libgift against ml_dtypes (NumPy's FP8 types), an independent reference.

Loads the shared library through its C API (ctypes) and checks:
  * encode of every fp32 bit pattern whose top 24 bits vary (low byte in a set of tie and
    near-tie values), with scale 1 (an E8M0 scale of 2^0), against ml_dtypes' nearest-even
    cast; ml_dtypes does not saturate, so values it sends to Inf/NaN must give +-max here;
  * decode of all 256 codes of both kinds;
  * bf16 and fp16 decode outputs against ml_dtypes/NumPy's casts of the fp32 decode.

Usage: test_ml_dtypes.py PATH/TO/libgift.so
"""
import ctypes
import sys
import unittest

import ml_dtypes
import numpy as np

LIB = None

F32, BF16, F16 = 0, 1, 2
E4M3, E5M2 = 0, 1
SCALE_TENSOR, SCALE_BLOCK = 0, 2
SCALE_F32, SCALE_E8M0 = 0, 1


class QuantParams(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("kind", ctypes.c_int),
        ("layout", ctypes.c_int),
        ("block", ctypes.c_uint32),
        ("tile_rows", ctypes.c_uint32),
        ("tile_cols", ctypes.c_uint32),
        ("scale_dtype", ctypes.c_int),
        ("rounding", ctypes.c_int),
        ("seed", ctypes.c_uint64),
        ("tensor_index", ctypes.c_uint32),
        ("nonfinite", ctypes.c_int),
    ]


KINDS = {E4M3: (ml_dtypes.float8_e4m3fn, 448.0), E5M2: (ml_dtypes.float8_e5m2, 57344.0)}


def params(kind, layout=SCALE_TENSOR, scale_dtype=SCALE_F32, nonfinite=0):
    p = QuantParams()
    LIB.giftQuantParamsInit(ctypes.byref(p))
    p.kind, p.layout, p.scale_dtype, p.nonfinite = kind, layout, scale_dtype, nonfinite
    return p


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def encode_unit_scale(x, kind):
    """Codes of x / 1: one E8M0 scale of 2^0 over a group whose amax is in [2^emax, 2^(emax+1))."""
    emax = 8 if kind == E4M3 else 15
    p = params(kind, SCALE_TENSOR, SCALE_E8M0, nonfinite=1)
    # Prepend an anchor that fixes amax in [2^emax, 2^(emax+1)), so the E8M0 scale is exactly
    # 1 for every value up to it, the top binade and its saturation included.
    anchor = np.nextafter(np.float32(2.0 ** (emax + 1)), np.float32(0))
    assert np.all(np.abs(x[np.isfinite(x)]) <= anchor)
    data = np.concatenate([[anchor], x]).astype(np.float32)
    codes = np.empty(data.size, np.uint8)
    scale = np.empty(1, np.uint8)
    r = LIB.giftEncode(None, ctypes.byref(p), ptr(data), F32, ctypes.c_uint64(1), ctypes.c_uint64(data.size),
                       ptr(codes), ptr(scale), ctypes.c_uint64(1), None)
    assert r == 0, LIB.giftGetLastErrorMessage()
    assert scale[0] == 127, scale[0]
    return codes[1:]


class MlDtypesReference(unittest.TestCase):
    def test_encode_matches_ml_dtypes_nearest_even(self):
        for kind, (dt, fmax) in KINDS.items():
            emax = 8 if kind == E4M3 else 15
            limit = np.float32(2.0 ** (emax + 1))
            hi = np.arange(1 << 24, dtype=np.uint32) << np.uint32(8)
            for low in (0x00, 0x01, 0x7F, 0x80, 0x81, 0xFF):
                bits = hi | np.uint32(low)
                x = bits.view(np.float32)
                x = x[np.isfinite(x) & (np.abs(x) < limit)]
                got = encode_unit_scale(x, kind)
                want_f = x.astype(dt)
                want = want_f.view(np.uint8).copy()
                # ml_dtypes overflows to Inf (E5M2) or NaN (E4M3); the GIFT rule saturates.
                over = ~np.isfinite(want_f.astype(np.float32))
                max_code = 0x7E if kind == E4M3 else 0x7B
                want[over] = np.where(np.signbit(x[over]), 0x80 | max_code, max_code)
                # The top binade and saturation are in the sample.
                self.assertTrue(np.any(over) and np.any(np.abs(x) > fmax / 2))
                bad = np.nonzero(got != want)[0]
                self.assertEqual(bad.size, 0,
                                 f"kind {kind}: x bits 0x{x[bad[:1]].view(np.uint32)} got {got[bad[:1]]} want {want[bad[:1]]}")

    def test_decode_all_codes(self):
        for kind, (dt, _) in KINDS.items():
            codes = np.arange(256, dtype=np.uint8)
            # All codes under one scale of 1 (fp32 scale bytes of 1.0).
            scale = np.array([1.0], np.float32)
            out = np.empty(256, np.float32)
            p = params(kind)
            r = LIB.giftDecode(None, ctypes.byref(p), ptr(codes), ptr(scale), ctypes.c_uint64(4),
                               ctypes.c_uint64(1), ctypes.c_uint64(256), ptr(out), F32)
            self.assertEqual(r, 0)
            want = codes.view(dt).astype(np.float32)
            nan = np.isnan(want)
            np.testing.assert_array_equal(np.isnan(out), nan)
            np.testing.assert_array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32))

    def test_sixteen_bit_outputs_round_like_numpy(self):
        rng = np.random.default_rng(3)
        x = (rng.standard_normal(1 << 16) ** 3).astype(np.float32)
        for kind in KINDS:
            p = params(kind, SCALE_BLOCK)
            codes = np.empty(x.size, np.uint8)
            nscale = x.size // 128
            scales = np.empty(nscale, np.float32)
            r = LIB.giftEncode(None, ctypes.byref(p), ptr(x), F32, ctypes.c_uint64(1), ctypes.c_uint64(x.size),
                               ptr(codes), ptr(scales), ctypes.c_uint64(nscale * 4), None)
            self.assertEqual(r, 0)
            outs = {}
            for name, dtc, npdt in (("f32", F32, np.float32), ("bf16", BF16, np.uint16), ("f16", F16, np.uint16)):
                o = np.empty(x.size, npdt)
                r = LIB.giftDecode(None, ctypes.byref(p), ptr(codes), ptr(scales), ctypes.c_uint64(nscale * 4),
                                   ctypes.c_uint64(1), ctypes.c_uint64(x.size), ptr(o), dtc)
                self.assertEqual(r, 0)
                outs[name] = o
            np.testing.assert_array_equal(outs["bf16"], outs["f32"].astype(ml_dtypes.bfloat16).view(np.uint16))
            np.testing.assert_array_equal(outs["f16"], outs["f32"].astype(np.float16).view(np.uint16))
            # And the fp32 decode is code * scale, with ml_dtypes' code values.
            want = codes.view(ml_dtypes.float8_e4m3fn if kind == E4M3 else ml_dtypes.float8_e5m2).astype(np.float32)
            want = want * np.repeat(scales, 128)
            np.testing.assert_array_equal(outs["f32"], want)


if __name__ == "__main__":
    LIB = ctypes.CDLL(sys.argv.pop(1))
    LIB.giftGetLastErrorMessage.restype = ctypes.c_char_p
    unittest.main(verbosity=1)
