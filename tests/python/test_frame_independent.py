#!/usr/bin/env python3
"""Decodes the golden GIFT frames from format/FORMAT.md alone, without libgift.

The header is parsed by flatc (FlatBuffers' own compiler, dumping it to JSON against
format/gift.fbs), checksums are computed with the xxhash package, zstd sections are expanded
with the zstandard package, FP8 codes are read with ml_dtypes, and the scale rule of
FORMAT.md 1.7/1.8 is applied in NumPy float32. The result must equal, bit for bit, the
values stored beside each golden frame: the specification is precise enough to write a
decoder from, and the golden files mean what it says.

Usage: test_frame_independent.py REPO_ROOT
"""
import glob
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import ml_dtypes
import numpy as np
import xxhash
import zstandard

ROOT = None
MAGIC = b"\x89GFT\r\n\x1a\n"
FP8 = {"E4M3": ml_dtypes.float8_e4m3fn, "E5M2": ml_dtypes.float8_e5m2}
RAW = {"F32": np.float32, "BF16": ml_dtypes.bfloat16, "F16": np.float16}


def flatc_json(header: bytes) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "header.bin")
        with open(path, "wb") as f:
            f.write(header)
        subprocess.run(["flatc", "--json", "--strict-json", "--raw-binary", "--defaults-json",
                        "-o", tmp, os.path.join(ROOT, "format", "gift.fbs"), "--", path],
                       check=True, capture_output=True)
        with open(os.path.join(tmp, "header.json")) as f:
            return json.load(f)


def section(frame: bytes, ref: dict, data_start: int, test: unittest.TestCase) -> bytes:
    off, stored, raw = ref["offset"], ref["stored_length"], ref["raw_length"]
    test.assertEqual(off % 64, 0)
    test.assertGreaterEqual(off, data_start)
    test.assertLessEqual(off + stored, len(frame))
    data = frame[off:off + stored]
    test.assertEqual(xxhash.xxh3_64_intdigest(data), ref["checksum"])
    if ref["compression"] == "Zstd":
        data = zstandard.ZstdDecompressor().decompress(data)
    test.assertEqual(len(data), raw)
    return data


def group_index(t: dict, rows: int, cols: int) -> np.ndarray:
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    layout = t["scale_layout"]
    if layout == "Tensor":
        g = np.zeros_like(r)
    elif layout == "Row":
        g = r
    elif layout == "Block":
        g = r * math.ceil(cols / t["block"]) + c // t["block"]
    else:
        g = (r // t["tile_rows"]) * math.ceil(cols / t["tile_cols"]) + c // t["tile_cols"]
    return g.reshape(-1)


def decode_tensor(frame: bytes, t: dict, data_start: int, test) -> np.ndarray:
    shape = t.get("shape") or []
    n = int(np.prod(shape)) if shape else 1
    cols = shape[-1] if shape else 1
    rows = n // cols if cols else (int(np.prod(shape[:-1])) if shape else 1)
    if t["encoding"] == "Raw":
        raw = section(frame, t["codes"], data_start, test)
        return np.frombuffer(raw, dtype=RAW[t["dtype"]]).astype(np.float32)
    if n == 0:
        return np.zeros(0, np.float32)
    codes = np.frombuffer(section(frame, t["codes"], data_start, test), dtype=np.uint8)
    values = codes.view(FP8[t["fp8"]]).astype(np.float32)
    scale_bytes = section(frame, t["scales"], data_start, test)
    if t["scale_dtype"] == "F32":
        scales = np.frombuffer(scale_bytes, dtype="<f4")
    else:  # E8M0: 2^(b - 127)
        b = np.frombuffer(scale_bytes, dtype=np.uint8).astype(np.int32)
        scales = np.ldexp(np.float32(1), b - 127).astype(np.float32)
    return (values * scales[group_index(t, rows, cols)]).astype(np.float32)


def parse_frame(frame: bytes, test) -> tuple:
    magic, major, minor, hlen, hsum, flen = struct.unpack_from("<8sHHIQQ", frame, 0)
    test.assertEqual(magic, MAGIC)
    test.assertEqual(flen, len(frame))
    header = frame[32:32 + hlen]
    test.assertEqual(header[4:8], b"GIFT")  # file identifier
    test.assertEqual(xxhash.xxh3_64_intdigest(header), hsum)
    return (major, minor, hlen), flatc_json(header)


def unwhiten(y: np.ndarray, basis: dict, name: str) -> np.ndarray:
    """FORMAT.md 2.4: W = (Y + (Y V) diag(c_inv) V^T) diag(d_sqrt)."""
    v = basis[name + "#v"].astype(np.float64)
    x = y.astype(np.float64)
    x = x + ((x @ v) * basis[name + "#c_inv"]) @ v.T
    return (x * basis[name + "#d_sqrt"]).astype(np.float32)


class IndependentDecoder(unittest.TestCase):
    def test_golden_frames_decode_from_the_spec(self):
        frames = sorted(glob.glob(os.path.join(ROOT, "format", "testdata", "v1.0", "*.gift")))
        self.assertGreaterEqual(len(frames), 4)
        tensors_checked = 0
        gift_tensors = 0
        for path in frames:
            with open(path, "rb") as f:
                frame = f.read()
            (major, minor, hlen), h = parse_frame(frame, self)
            self.assertEqual((major, minor), (1, 0))
            self.assertEqual(h["kind"], "Tensors")
            basis = None
            if h.get("basis"):  # the embedded basis: a complete frame of kind Basis
                inner = section(frame, h["basis"], 32 + hlen, self)
                _, bh = parse_frame(inner, self)
                self.assertEqual(bh["kind"], "Basis")
                _, _, _, bhlen, _, _ = struct.unpack_from("<8sHHIQQ", inner, 0)
                basis = {t["name"]: decode_tensor(inner, t, 32 + bhlen, self).reshape(t.get("shape", []))
                         for t in bh["tensors"]}
            spans = []
            for i, t in enumerate(h["tensors"]):
                want = np.load(f"{path[:-5]}.{i}.npy")
                got = decode_tensor(frame, t, 32 + hlen, self)
                self.assertEqual(got.shape, want.shape, t["name"])
                if t["coords"] == "Gift":
                    self.assertIsNotNone(basis, "a tensor in GIFT coordinates needs the embedded basis")
                    got = unwhiten(got.reshape(t["shape"]), basis, t["name"]).reshape(-1)
                    err = np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want.astype(np.float64))
                    self.assertLess(err, 1e-5, t["name"])
                    gift_tensors += 1
                else:
                    self.assertTrue(np.array_equal(got.view(np.uint32), want.view(np.uint32)),
                                    f"{os.path.basename(path)}: tensor {t['name']!r}")
                tensors_checked += 1
                for key in ("codes", "scales"):
                    if key in t and t[key] is not None:
                        spans.append((t[key]["offset"], t[key]["stored_length"]))
            if h.get("basis"):
                spans.append((h["basis"]["offset"], h["basis"]["stored_length"]))
            spans.sort()
            for (a, la), (b, _) in zip(spans, spans[1:]):
                self.assertLessEqual(a + la, b, "sections overlap")
            self.assertEqual(spans[-1][0] + spans[-1][1], len(frame), "frame ends at its last section")
        self.assertGreaterEqual(gift_tensors, 1)
        self.assertGreaterEqual(tensors_checked, 19)


if __name__ == "__main__":
    ROOT = sys.argv.pop(1)
    unittest.main(verbosity=1)
