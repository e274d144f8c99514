#!/usr/bin/env python3
"""giftc end to end: every command on the bundled sample and on generated data, files
cross-checked with the safetensors and NumPy packages, values against an independent NumPy
model of the FORMAT.md rules, every exit code provoked.

Usage: test_giftc.py PATH/TO/giftc REPO_ROOT
"""
import errno
import fcntl
import json
import math
import os
import pathlib
import re
import select
import stat
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile

import ml_dtypes
import numpy as np
import xxhash
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

GIFTC = None
ROOT = None


def run(*args, cwd=None):
    return subprocess.run([GIFTC, *map(str, args)], cwd=cwd, capture_output=True, text=True)


def on_terminal(*args, locale="C.UTF-8"):
    """giftc's output (stdout and stderr together) on a pseudo-terminal, under `locale`."""
    import pty
    pid, fd = pty.fork()
    if pid == 0:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LC_")}
        env.update(LANG=locale, LC_ALL=locale)
        os.execve(GIFTC, [GIFTC, *map(str, args)], env)
    seen = b""
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        seen += data
    os.waitpid(pid, 0)
    return seen


def model_block_e4m3(x: np.ndarray, block: int = 128) -> np.ndarray:
    """FORMAT.md 1.7 in NumPy: per row, blocks of `block`, s = amax/448 (fp32), code = x/s."""
    rows, cols = x.shape
    out = np.empty_like(x, dtype=np.float32)
    for b0 in range(0, cols, block):
        part = x[:, b0:b0 + block].astype(np.float32)
        amax = np.max(np.abs(part), axis=1, keepdims=True).astype(np.float32)
        s = (amax / np.float32(448)).astype(np.float32)
        safe = np.where(s > 0, s, np.float32(1))
        v = (part / safe).astype(np.float32)
        codes = v.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
        out[:, b0:b0 + block] = np.where(s > 0, (codes * s).astype(np.float32), np.float32(0))
    return out


class Giftc(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def preloading(self, shim, **env):
        """The environment that preloads tests/cli/SHIM.c, built into the test's folder as
        SHIM.so, into giftc; skips the test where there is no C compiler."""
        import shutil

        if not shutil.which("cc"):
            self.skipTest("no C compiler for the shim")
        built = self.path(shim + ".so")
        subprocess.run(["cc", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", built,
                        os.path.join(ROOT, "tests", "cli", shim + ".c"), "-ldl"], check=True)
        return dict(os.environ, LD_PRELOAD=built, **env,  # (ASan's runtime then comes second)
                    ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0")

    def test_inputs_that_are_pipes_are_refused_at_once_saying_to_use_standard_input(self):
        # A FIFO without a writer made giftc wait in open() (a name without an extension, or
        # any for encode and fit), and one with a writer was "not a regular file": refused
        # before it is opened, saying what to do, for each command and each input.
        src, frame = self.path("w.npy"), self.path("w.gift")
        np.save(src, np.ones((4, 64), np.float32))
        self.assertEqual(run("encode", src, "-o", frame, "-q").returncode, 0)
        fifo, named = self.path("fifo"), self.path("fifo.safetensors")
        os.mkfifo(fifo)
        os.mkfifo(named)
        why = "not a regular file but a pipe or device (giftc reads one as standard input: give - and redirect it)"
        for args in (("encode", fifo), ("encode", named), ("fit", named, "-o", self.path("b.giftb")),
                     ("decode", fifo), ("inspect", fifo), ("compare", src, fifo),
                     ("compare", fifo, frame),
                     ("decode", frame, "--basis", fifo, "-o", self.path("d.npy"))):
            r = subprocess.run([GIFTC, *args], capture_output=True, text=True, timeout=20)
            self.assertEqual(r.returncode, 3, (args, r.stderr))
            self.assertIn(why, r.stderr, args)
        # A pipe with a writer (a shell's <(...)) is refused as well, and standard input takes it.
        read_end, write_end = os.pipe()
        with open(src, "rb") as f:
            os.write(write_end, f.read())
        os.close(write_end)
        r = subprocess.run([GIFTC, "encode", f"/dev/fd/{read_end}", "-o", self.path("p.gift")],
                           capture_output=True, text=True, timeout=20, pass_fds=(read_end,))
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn(why, r.stderr)
        with open(src, "rb") as f:
            r = subprocess.run([GIFTC, "encode", "-", "-o", self.path("p.gift"), "-q"], stdin=f)
        self.assertEqual(r.returncode, 0)
        os.close(read_end)

    def test_outputs_that_are_not_plain_new_files_are_refused_or_written_into(self):
        # -f replaces an existing regular output only: never a link or an input. A device or
        # a FIFO is written into as standard output is (as zstd -o /dev/null does).
        src = self.path("in.npy")
        np.save(src, np.ones((4, 64), np.float32))
        fifo, link, target = self.path("fifo"), self.path("link.gift"), self.path("target.gift")
        os.mkfifo(fifo)
        with open(target, "wb") as f:
            f.write(b"keep")
        os.symlink(target, link)
        hard = self.path("hard.npy")
        os.link(src, hard)
        folder = self.path("dir.gift")
        os.mkdir(folder)
        for out, why in ((link, "is a symbolic link; giftc replaces only regular files"),
                         (folder, "not a regular file"), (src, "is the input"),
                         (hard, "is the input")):
            r = run("encode", src, "-o", out, "-f")
            self.assertEqual(r.returncode, 1, out)
            self.assertIn(why, r.stderr)
        self.assertEqual(pathlib.Path(target).read_bytes(), b"keep")
        # /dev/stdout with standard output on a file is a link too: the message says what
        # standard output is.
        with open(self.path("stdout.gift"), "wb") as f:
            r = subprocess.run([GIFTC, "encode", src, "-f", "-o", "/dev/stdout"], stdout=f,
                               stderr=subprocess.PIPE, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("/dev/stdout: is a symbolic link; giftc replaces only regular files (for "
                      "standard output, give -o -)", r.stderr)
        self.assertEqual(run("encode", src, "-o", "/dev/null", "-q").returncode, 0)
        self.assertTrue(os.path.exists("/dev/null") and not os.path.isfile("/dev/null"))
        import threading

        def through_fifo(path, *args):  # what giftc writes into the FIFO at path
            got = []
            reader = threading.Thread(target=lambda: got.append(pathlib.Path(path).read_bytes()))
            reader.start()
            r = run(*args, "-o", path, "-q")
            reader.join(timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            return got

        want = subprocess.run([GIFTC, "encode", src, "-c", "-q"], capture_output=True).stdout
        self.assertEqual(through_fifo(fifo, "encode", src), [want])
        self.assertFalse(os.path.isfile(fifo))
        # Opened once the input is read: a missing input fails at once, though no reader
        # comes; and a FIFO named .npy gets .npy, as a file of that name does.
        r = subprocess.run([GIFTC, "encode", self.path("missing.npy"), "-o", fifo],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 3, r.stderr)
        frame, npy_fifo, npy_file = self.path("in.gift"), self.path("f.npy"), self.path("d.npy")
        self.assertEqual(run("encode", src, "-o", frame, "-q").returncode, 0)
        self.assertEqual(run("decode", frame, "-o", npy_file, "-q").returncode, 0)
        os.mkfifo(npy_fifo)
        self.assertEqual(through_fifo(npy_fifo, "decode", frame),
                         [pathlib.Path(npy_file).read_bytes()])
        with open(target, "rb") as f:
            self.assertEqual(f.read(), b"keep")
        self.assertTrue(os.path.islink(link))
        np.testing.assert_array_equal(np.load(src), np.ones((4, 64), np.float32))

    def test_a_terminal_named_as_the_output_is_refused_before_the_work(self):
        # As standard output is: checked before the input is read (the input here is standard
        # input from a pipe that never gets a byte, so reading it first would hang the command),
        # and written into with -f. Its reader is the pty's other side, in raw mode so the
        # bytes come unchanged.
        import pty
        import threading
        import tty

        src, frame = self.path("t.npy"), self.path("t.gift")
        np.save(src, np.ones((4, 64), np.float32))
        self.assertEqual(run("encode", src, "-o", frame, "-q").returncode, 0)
        silent, held = os.pipe()  # held open, never written: reads block
        master, slave = pty.openpty()
        tty.setraw(slave)
        terminal = os.ttyname(slave)
        try:
            for command in ("encode", "decode", "fit"):
                r = subprocess.run([GIFTC, command, "-", "-o", terminal], stdin=silent,
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 1, command)
                self.assertIn(terminal + ": not writing binary data to a terminal", r.stderr)
            got = bytearray()

            def read_all():
                while True:
                    try:
                        data = os.read(master, 65536)
                    except OSError:
                        return
                    if not data:
                        return
                    got.extend(data)

            reader = threading.Thread(target=read_all, daemon=True)
            reader.start()
            r = run("encode", src, "-o", terminal, "-f", "-q")
            self.assertEqual(r.returncode, 0, r.stderr)
            os.close(slave)
            slave = -1
            reader.join(timeout=60)
            self.assertEqual(bytes(got), pathlib.Path(frame).read_bytes())
        finally:
            for fd in (silent, held, master, slave):
                if fd >= 0:
                    os.close(fd)

    def test_outputs_take_their_inputs_permissions(self):
        # As gzip and zstd: a dump only its owner reads gave a frame (and a decode) readable by
        # all (0644 under the usual umask). fit takes what all its inputs share.
        rng = np.random.default_rng(2)
        src = self.path("g.safetensors")
        save_file({"w": rng.standard_normal((64, 32)).astype(np.float32)}, src)
        mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)
        for bits in (0o600, 0o640, 0o644):
            os.chmod(src, bits)
            frame, back = self.path("g.gift"), self.path("back.safetensors")
            self.assertEqual(run("encode", src, "-o", frame, "-q", "-f").returncode, 0)
            self.assertEqual(run("decode", frame, "-o", back, "-q", "-f").returncode, 0)
            self.assertEqual((mode(frame), mode(back)), (bits, bits))
        other = self.path("h.safetensors")
        save_file({"w": rng.standard_normal((64, 32)).astype(np.float32)}, other)
        os.chmod(src, 0o640)
        os.chmod(other, 0o604)
        basis = self.path("b.giftb")
        self.assertEqual(run("fit", src, other, "-o", basis, "-q").returncode, 0)
        self.assertEqual(mode(basis), 0o600)
        # Where the file system cannot set them, the output keeps the bits it was made with:
        # it is not lost for its permissions.
        frame = self.path("nochmod.gift")
        r = subprocess.run([GIFTC, "encode", src, "-o", frame, "-q"], capture_output=True,
                           text=True, env=self.preloading("no_chmod"))
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        self.assertTrue(os.path.isfile(frame))

    def test_an_empty_output_name_is_a_usage_error(self):
        # -o "" wrote the default name (encode) as if no -o had been given.
        src = self.path("x.npy")
        np.save(src, np.ones(4, np.float32))
        for command in (["encode", src], ["decode", src + ".gift"], ["fit", src]):
            r = run(*command, "-o", "")
            self.assertEqual(r.returncode, 1, command)
            self.assertIn("--output: an empty file name", r.stderr)
        # Nor does --basis "" mean no basis, or --activations "" none (both went unnoticed).
        for command, option in ((["encode", src, "--basis", ""], "--basis"),
                                (["decode", src + ".gift", "--basis", ""], "--basis"),
                                (["compare", src, src, "--activations", ""], "--activations"),
                                (["fit", src, "-o", self.path("b.giftb"), "--activations", ""],
                                 "--activations")):
            r = run(*command)
            self.assertEqual(r.returncode, 1, command)
            self.assertIn(option + ": an empty file name", r.stderr)
        self.assertEqual(os.listdir(self.dir), ["x.npy"])

    def test_standard_input_from_a_terminal_is_refused(self):
        # As gzip and zstd refuse it: each command waited for bytes typed by hand.
        import pty

        master, slave = pty.openpty()
        try:
            for command in (["encode", "-", "-o", self.path("x.gift")],
                            ["decode", "-", "-o", self.path("x.npy")], ["inspect", "-"],
                            ["compare", "-", self.path("x.gift")],
                            ["fit", "-", "-o", self.path("x.giftb")]):
                r = subprocess.run([GIFTC, *command], stdin=slave, capture_output=True,
                                   text=True, timeout=60)
                self.assertEqual(r.returncode, 1, command)
                self.assertIn("standard input is a terminal", r.stderr)
            self.assertEqual(os.listdir(self.dir), [])
        finally:
            os.close(master)
            os.close(slave)
        # Standard input read twice: the second read found it empty ("not a safetensors file").
        for command in (["fit", "-", "-", "-o", self.path("x.giftb")],
                        ["fit", "-", "--activations", "-", "-o", self.path("x.giftb")]):
            r = subprocess.run([GIFTC, *command], input=b"", capture_output=True, timeout=60)
            self.assertEqual(r.returncode, 1, command)
            self.assertIn(b"standard input (-) can be read once", r.stderr)

    def test_standard_input_and_output_give_the_files_bytes(self):
        src = self.path("g.safetensors")
        rng = np.random.default_rng(5)
        save_file({"w": rng.standard_normal((96, 200)).astype(np.float32),
                   "b": rng.standard_normal(200).astype(np.float32)}, src,
                  metadata={"step": "7"})
        frame = self.path("g.gift")
        self.assertEqual(run("encode", src, "-o", frame, "-q").returncode, 0)
        with open(src, "rb") as f:
            raw = f.read()
        with open(frame, "rb") as f:
            frame_bytes = f.read()
        piped = subprocess.run([GIFTC, "encode", "-", "-q"], input=raw, capture_output=True)
        self.assertEqual(piped.returncode, 0, piped.stderr)
        self.assertEqual(piped.stdout, frame_bytes)
        for args in (["-c"], ["-o", "-"]):
            r = subprocess.run([GIFTC, "encode", src, "-q", *args], capture_output=True)
            self.assertEqual(r.stdout, frame_bytes, args)
        decoded = self.path("g.decoded.safetensors")
        self.assertEqual(run("decode", frame, "-o", decoded, "-q").returncode, 0)
        with open(decoded, "rb") as f:
            decoded_bytes = f.read()
        r = subprocess.run([GIFTC, "decode", "-", "-q"], input=frame_bytes, capture_output=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, decoded_bytes)
        one = self.path("one.npy")
        np.save(one, rng.standard_normal((8, 64)).astype(np.float32))
        self.assertEqual(run("encode", one, "-q").returncode, 0)
        self.assertEqual(run("decode", one + ".gift", "-q").returncode, 0)
        r = subprocess.run([GIFTC, "decode", one + ".gift", "-c", "--format", "npy", "-q"],
                           capture_output=True)
        with open(self.path("one.decoded.npy"), "rb") as f:
            self.assertEqual(r.stdout, f.read())
        # Damaged input on standard input is named as such.
        r = subprocess.run([GIFTC, "decode", "-"], input=frame_bytes[:-9], capture_output=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn(b"standard input", r.stderr)
        r = run("decode", frame, "-c", "-o", self.path("x.safetensors"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("-c and -o", r.stderr)
        # fit writes its basis to standard output (-o -) as it writes the file.
        basis = self.path("g.giftb")
        self.assertEqual(run("fit", src, "-o", basis, "-q").returncode, 0)
        r = subprocess.run([GIFTC, "fit", src, "-o", "-", "-q"], capture_output=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, pathlib.Path(basis).read_bytes())
        self.assertFalse(os.path.exists("-"))
        # compare reads a tensor file or a frame from standard input, told apart as encode does
        want = run("compare", src, frame, "--json")
        self.assertEqual(want.returncode, 0, want.stderr)
        with open(src, "rb") as f:
            src_bytes = f.read()
        for args, data in ((["-", frame], src_bytes), ([src, "-"], frame_bytes)):
            r = subprocess.run([GIFTC, "compare", *args, "--json"], input=data, capture_output=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["tensors"], json.loads(want.stdout)["tensors"])
        # Standard input once: the activations (or a basis) from it too were read after the
        # reference had taken it ("not a safetensors file").
        for args in (["-", "-"], ["-", frame, "--activations", "-"],
                     [src, "-", "--basis", "-"]):
            r = subprocess.run([GIFTC, "compare", *args], input=frame_bytes, capture_output=True)
            self.assertEqual(r.returncode, 1, args)
            self.assertIn(b"standard input (-) can be read once", r.stderr)

    def test_commands_start_under_a_data_cap_without_blas_settings(self):
        # libgift loads OpenBLAS only where a command needs it (fit, compare --activations):
        # under a ulimit -d that leaves no room for OpenBLAS's buffers, and with
        # none of its settings, the commands that do not need it start and work. (Linked,
        # OpenBLAS started one thread per processor as giftc was loaded, and --version hung
        # under this cap.)
        import resource

        env = {k: v for k, v in os.environ.items()
               if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")}

        def capped():
            resource.setrlimit(resource.RLIMIT_DATA, (16 << 20, 16 << 20))

        def run_capped(*args):
            try:
                return subprocess.run([GIFTC, *map(str, args)], capture_output=True, text=True,
                                      preexec_fn=capped, env=env, timeout=120)
            except subprocess.TimeoutExpired:
                self.fail(f"giftc {' '.join(map(str, args))} hung under RLIMIT_DATA")

        r = run_capped("--version")
        if r.returncode != 0 and "Sanitizer" in r.stderr:
            self.skipTest("a sanitizer build cannot start under RLIMIT_DATA")
        self.assertEqual(r.returncode, 0, r.stderr)
        rng = np.random.default_rng(3)
        w = rng.standard_normal((1024, 256)).astype(np.float32)
        src, frame = self.path("cap.safetensors"), self.path("cap.gift")
        out = self.path("cap.out.safetensors")
        save_file({"w": w}, src)
        for args in (["encode", src, "-o", frame, "-q"], ["inspect", frame, "--verify"],
                     ["decode", frame, "-o", out, "-q"], ["compare", src, frame]):
            r = run_capped(*args)
            self.assertEqual(r.returncode, 0, (args, r.stderr))
        got = load_file(out)["w"]  # E4M3's relative error is at most 2^-4 where it is normal
        self.assertLess(np.linalg.norm(got - w) / np.linalg.norm(w), 2 ** -4)

    def test_memory_does_not_grow_with_a_row(self):
        # A vector is one row, and a tile's rows one band: encode (24 MiB), decode, compare and
        # inspect --verify take them in parts, under 8 MiB of private memory (RLIMIT_DATA; compare
        # 40), where a row of 256 MiB (a frame of a few KiB, zeros compressed) or a band of
        # 64 MiB would not fit. The tensors hold zeros but one value per 1 MiB, written into a sparse file.
        import resource

        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")

        def run_capped(*args, mib=8):
            def capped():
                resource.setrlimit(resource.RLIMIT_DATA, (mib << 20, mib << 20))

            return subprocess.run([GIFTC, *map(str, args)], capture_output=True, text=True,
                                  preexec_fn=capped, env=env, timeout=600)

        if run_capped("--version").returncode != 0:
            self.skipTest("giftc cannot start under RLIMIT_DATA (a sanitizer build)")
        shapes = {"vector": [1 << 26], "wide": [2, 1 << 25], "tall": [4096, 4096]}
        header, at = {}, 0
        for name, shape in shapes.items():
            n = math.prod(shape) * 4
            header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [at, at + n]}
            at += n
        js = json.dumps(header).encode()
        js += b" " * (-len(js) % 8)
        src = self.path("rows.safetensors")
        with open(src, "wb") as f:
            f.write(struct.pack("<Q", len(js)) + js)
            f.truncate(8 + len(js) + at)
            for k in range(0, at, 1 << 20):
                f.seek(8 + len(js) + k)
                f.write(struct.pack("<f", 1.0 + k / at))
        want = load_file(src)
        for args in ([], ["--zstd"], ["--zstd", "--scale", "row"],
                     ["--zstd", "--scale", "tile:4096x128"],
                     ["--zstd", "--scale", "tile:1x4294967295"]):  # a part within a tile
            frame, out = self.path("rows.gift"), self.path("rows.out.safetensors")
            # encode too takes a row in parts and a tile's rows in bands (24 MiB: two parts'
            # codes, the scales, zstd's state; a row's codes are 32 MiB, a tile row's 16).
            r = run_capped("encode", src, "-o", frame, "-f", "-q", "--threads", "1", *args,
                           mib=24)
            self.assertEqual(r.returncode, 0, (args, r.stderr))
            r = run_capped("decode", frame, "-o", out, "-f", "-q", "--threads", "1")
            self.assertEqual(r.returncode, 0, (args, r.stderr))
            got = load_file(out)
            for name in shapes:  # zeros stay zeros; the ones in [1, 2) within E4M3's step
                np.testing.assert_allclose(got[name], want[name], rtol=2 ** -4, err_msg=name)
            r = run_capped("inspect", frame, "--verify", "--threads", "1")
            self.assertEqual(r.returncode, 0, (args, r.stderr))
            # compare holds two bands of 2M fp32 values (16 MiB) and a window of compressed
            # codes, not a row of 64M values.
            r = run_capped("compare", src, frame, "--json", "--threads", "1", mib=40)
            self.assertEqual(r.returncode, 0, (args, r.stderr))
            m = {t["name"]: t for t in json.loads(r.stdout)["tensors"]}
            self.assertLess(m["wide"]["rel_l2"], 2 ** -4, args)
            os.unlink(out)
        # Scales are not held whole either: blocks of 16 of the wide tensor have 16 MiB of
        # them (mostly zeros), which encode spills as it makes them (under 14 MiB, where they
        # would not fit), and decode (10 MiB: its two bands and the writing thread's stack
        # besides), inspect --verify (8 MiB) and compare (40 MiB) read through a window,
        # compressed.
        frame = self.path("rows.gift")
        r = run_capped("encode", src, "-o", frame, "-f", "-q", "--threads", "1", "--zstd",
                       "--scale", "block:16", mib=14)
        self.assertEqual(r.returncode, 0, r.stderr)
        info = json.loads(run("inspect", frame, "--json").stdout)
        wide = next(t for t in info["tensors"] if t["name"] == "wide")
        self.assertLess(wide["stored_bytes"], 1 << 20, wide)  # scales compressed too
        r = run_capped("decode", frame, "-o", "/dev/null", "-f", "-q", "--threads", "1", mib=10)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_capped("inspect", frame, "--verify", "--threads", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_capped("compare", src, frame, "--json", "--threads", "1", mib=40)
        self.assertEqual(r.returncode, 0, r.stderr)
        m = {t["name"]: t for t in json.loads(r.stdout)["tensors"]}
        self.assertLess(m["wide"]["rel_l2"], 2 ** -4)

    def test_npz_members_are_held_one_at_a_time(self):
        # numpy.savez_compressed deflates its members (and some numpy versions' savez puts
        # them at odd offsets): giftc makes one member at a time, in a buffer of its own up to
        # 16 MiB, a larger one in a scratch file in $TMPDIR that it maps. Encode (24 MiB of
        # private memory, RLIMIT_DATA) and compare (40 MiB) of two members of 48 MiB and one
        # of 1 MiB give the bytes of the same tensors from a safetensors file, and leave
        # nothing in $TMPDIR.
        import resource

        def capped(mib):
            return lambda: resource.setrlimit(resource.RLIMIT_DATA, (mib << 20, mib << 20))

        scratch = self.path("scratch")
        os.mkdir(scratch)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", TMPDIR=scratch)
        if subprocess.run([GIFTC, "--version"], preexec_fn=capped(24), env=env,
                          capture_output=True).returncode != 0:
            self.skipTest("giftc cannot start under RLIMIT_DATA (a sanitizer build)")
        rng = np.random.default_rng(4)
        tensors = {f"m{i}": rng.standard_normal((3072, 4096), np.float32) for i in range(2)}
        tensors["small"] = rng.standard_normal((512, 512), np.float32)
        ref = self.path("ref.safetensors")
        save_file(tensors, ref)
        want = self.path("ref.gift")
        self.assertEqual(run("encode", ref, "-o", want, "-q", "--threads", "1").returncode, 0)
        for save in (np.savez, np.savez_compressed):
            z = self.path("m.npz")
            save(z, **tensors)
            frame = self.path("m.gift")
            r = subprocess.run([GIFTC, "encode", z, "-o", frame, "-f", "-q", "--threads", "1"],
                               preexec_fn=capped(24), env=env, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, (save.__name__, r.stderr))
            self.assertEqual(pathlib.Path(frame).read_bytes(), pathlib.Path(want).read_bytes(),
                             save.__name__)
            r = subprocess.run([GIFTC, "compare", z, ref, "--json", "--threads", "1"],
                               preexec_fn=capped(40), env=env, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, (save.__name__, r.stderr))
            self.assertEqual([t["max_abs"] for t in json.loads(r.stdout)["tensors"]], [0.0] * 3)
            self.assertEqual(os.listdir(scratch), [])
        # A tensor at an odd offset of a safetensors file (after 3 fp16 values) goes the same
        # way: it decodes as the same tensor read in place.
        small = np.arange(3, dtype=np.float16)
        big = tensors["m0"]
        header = json.dumps({"a": {"dtype": "F16", "shape": [3], "data_offsets": [0, 6]},
                             "big": {"dtype": "F32", "shape": list(big.shape),
                                     "data_offsets": [6, 6 + big.nbytes]}}).encode()
        header += b" " * (-len(header) % 8)
        odd = self.path("odd.safetensors")
        with open(odd, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + small.tobytes() + big.tobytes())
        aligned = self.path("aligned.safetensors")
        save_file({"big": big}, aligned)
        decoded = {}
        for src, cap in ((odd, 24), (aligned, 1024)):
            frame, out = self.path("one.gift"), self.path("one.safetensors")
            r = subprocess.run([GIFTC, "encode", src, "-o", frame, "-f", "-q", "--threads", "1"],
                               preexec_fn=capped(cap), env=env, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, (src, r.stderr))
            self.assertEqual(run("decode", frame, "-o", out, "-f", "-q").returncode, 0)
            decoded[src] = load_file(out)
        np.testing.assert_array_equal(decoded[odd]["big"], decoded[aligned]["big"])
        np.testing.assert_array_equal(decoded[odd]["a"], small)
        self.assertEqual(os.listdir(scratch), [])
        # A scratch file that cannot be made is an error, found when the archive is opened,
        # that names the archive, the member and the folder.
        full = subprocess.run([GIFTC, "encode", z, "-o", frame, "-f", "-q"], capture_output=True,
                              text=True, env=dict(env, TMPDIR=self.path("no-such-dir")))
        self.assertEqual(full.returncode, 3, full.stderr)
        self.assertIn(z + ": tensor 'm0': cannot create a scratch file in " +
                      self.path("no-such-dir"), full.stderr)

    def test_memory_does_not_grow_with_the_file(self):
        # RLIMIT_DATA caps the process's private writable memory (not the page cache of the
        # files it maps): a 256 MiB dump must encode and decode under 96 MiB of it, so
        # neither command may hold its output or the input's codes whole.
        import resource

        limit = 96 << 20

        def capped():
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

        def tightly_capped():
            resource.setrlimit(resource.RLIMIT_DATA, (24 << 20, 24 << 20))

        # decode works through bands of 512 KiB per thread (it needs 4 to 5 MiB here): a
        # tensor's codes (16 MiB), or its decoded band as it was (8 MiB), would not fit.
        def decode_capped():
            resource.setrlimit(resource.RLIMIT_DATA, (8 << 20, 8 << 20))

        # OpenBLAS's worker threads retry a failed buffer allocation forever: one thread.
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")

        def run_capped(*args, cap=capped):
            return subprocess.run([GIFTC, *map(str, args)], capture_output=True, text=True,
                                  preexec_fn=cap, env=env, timeout=600)

        if run_capped("--version").returncode != 0:
            self.skipTest("giftc cannot start under RLIMIT_DATA (a sanitizer build)")
        rng = np.random.default_rng(9)
        tensors = {f"layer{i}": (rng.standard_normal((4096, 4096), np.float32) * 1e-3)
                   for i in range(4)}
        src = self.path("big.safetensors")
        save_file(tensors, src)
        frame, out = self.path("big.gift"), self.path("big.out.safetensors")
        r = run_capped("encode", src, "-o", frame, "--threads", "1", "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_capped("decode", frame, "-o", out, "--threads", "1", "-q", cap=decode_capped)
        self.assertEqual(r.returncode, 0, r.stderr)
        back = load_file(out)
        self.assertEqual(sorted(back), sorted(tensors))
        np.testing.assert_array_equal(back["layer2"][:64], model_block_e4m3(tensors["layer2"][:64]))
        # Under zstd too: sections compressed as they are made, read back through a window.
        # Encode within 24 MiB, which a tensor's codes (16 MiB) plus their compressed copy
        # would not fit under (giftc needs 8 to 16 MiB here).
        zframe, zout = self.path("big.zst.gift"), self.path("big.zst.safetensors")
        r = run_capped("encode", src, "-o", zframe, "--zstd", "--threads", "1", "-q",
                       cap=tightly_capped)
        self.assertEqual(r.returncode, 0, r.stderr)
        info = json.loads(run("inspect", zframe, "--json").stdout)
        self.assertTrue(all(t["stored_bytes"] < t["decompressed_bytes"] for t in info["tensors"]), info)
        r = run_capped("decode", zframe, "-o", zout, "--threads", "1", "-q", cap=decode_capped)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(pathlib.Path(zout).read_bytes(), pathlib.Path(out).read_bytes())
        os.unlink(zout)
        # Out of memory is exit status 3 (not "invalid input"), and leaves no output: zstd's
        # level 19 needs tens of MiB for its tables.
        def starved():
            resource.setrlimit(resource.RLIMIT_DATA, (8 << 20, 8 << 20))

        if run_capped("--version", cap=starved).returncode == 0:
            starved_out = self.path("starved.gift")
            r = run_capped("encode", src, "-o", starved_out, "--zstd=19", "--threads", "1",
                           cap=starved)
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertFalse(os.path.exists(starved_out))
        # One scale per tensor (a first pass for its amax) with stochastic rounding (random
        # words counted from each band's place in the tensor), in bands too.
        r = run_capped("encode", src, "-o", zframe, "-f", "--scale", "tensor", "--rounding",
                       "stochastic", "--threads", "1", "-q", cap=tightly_capped)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(run("decode", zframe, "-o", zout, "-q").returncode, 0)
        got, want = load_file(zout)["layer1"], tensors["layer1"]
        self.assertLess(np.linalg.norm(got - want) / np.linalg.norm(want), 0.1)
        # In GIFT coordinates too (whitened band by band): a 128 MiB fp32 matrix, whose fp32
        # copy alone would not fit, and the basis fitted on a slice of it.
        w = rng.standard_normal((32768, 1024), np.float32) * 1e-3
        src, part = self.path("wide.safetensors"), self.path("wide.part.safetensors")
        save_file({"w": w}, src)
        save_file({"w": w[:512]}, part)
        basis, frame, out = self.path("wide.giftb"), self.path("wide.gift"), self.path("wide.out.npy")
        self.assertEqual(run("fit", part, "-o", basis, "-q").returncode, 0)
        r = run_capped("encode", src, "--basis", basis, "--coords", "gift", "-o", frame,
                       "--threads", "1", "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        info = json.loads(run("inspect", frame, "--json").stdout)
        self.assertEqual([t["coords"] for t in info["tensors"]], ["gift"])
        r = run_capped("decode", frame, "--basis", basis, "-o", out, "--threads", "1", "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        back = np.load(out)
        err = np.linalg.norm(back - w) / np.linalg.norm(w)
        self.assertLess(err, 0.1)  # E4M3's relative step is 2^-4; a wrong band would be ~1
        # The cap is real: a buffer of the output's size does not fit under it.
        r = run_capped("bench", "--size", str(256 << 20), "--threads", "1", "-q")
        self.assertNotEqual(r.returncode, 0)

    def test_closed_standard_streams_are_not_taken_by_giftcs_own_files(self):
        # With stderr closed, encode's scratch file became fd 2 and a warning landed in the
        # frame (exit 0, checksum mismatch); with stdout closed, encode -c wrote the frame into
        # its scratch file and exited 0; with stdin closed, encode - read its scratch file.
        rng = np.random.default_rng(14)
        fitted, src = self.path("g1.safetensors"), self.path("g3.safetensors")
        save_file({"w": rng.standard_normal((128, 64)).astype(np.float32)}, fitted)
        save_file({"w": rng.standard_normal((128, 32)).astype(np.float32),  # the basis is 64 wide
                   "x": rng.standard_normal((128, 64)).astype(np.float32)}, src)
        basis, frame = self.path("b.giftb"), self.path("g3.gift")
        self.assertEqual(run("fit", fitted, "-o", basis, "--rank", 8, "-q").returncode, 0)
        self.assertIn("stays in Euclidean coordinates",
                      run("encode", src, "--basis", basis, "--coords", "gift", "-o", frame).stderr)
        os.unlink(frame)
        closed = lambda fd: (lambda: os.close(fd))  # noqa: E731
        r = subprocess.run([GIFTC, "encode", src, "--basis", basis, "--coords", "gift", "-o", frame],
                           preexec_fn=closed(2))
        self.assertEqual(r.returncode, 0)
        r = run("inspect", "--verify", frame)
        self.assertEqual(r.returncode, 0, r.stderr)
        for args, fd, says in ((["encode", src, "-c"], 1, "standard output: write failed"),
                               (["encode", "-", "-o", self.path("in.gift")], 0,
                                "standard input: read failed")):
            r = subprocess.run([GIFTC, *args], preexec_fn=closed(fd), capture_output=True, text=True)
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertIn(says + ": " + os.strerror(errno.EBADF), r.stderr)
        self.assertFalse(os.path.exists(self.path("in.gift")))

    def test_a_full_disk_or_an_interrupt_leaves_no_output(self):
        import resource
        import signal
        import time

        src = self.path("in.safetensors")
        save_file({"w": np.ones((2048, 1024), np.float32)}, src)
        out = self.path("out.gift")

        # Past the file-size limit giftc reports the failed write (it ignores SIGXFSZ, which
        # Python's subprocess restores to its default, ending the process), on one codec thread
        # (its output written behind) or on two.
        def small_files():
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

        for threads in ("1", "2"):
            r = subprocess.run([GIFTC, "encode", src, "-o", out, "--threads", threads],
                               capture_output=True, text=True, preexec_fn=small_files)
            self.assertEqual(r.returncode, 3, (threads, r.stderr))
            self.assertIn("out.gift: write failed: File too large", r.stderr)
            self.assertEqual(sorted(os.listdir(self.dir)), ["in.safetensors"])
        self.assertEqual(run("encode", src, "-o", out, "-q").returncode, 0)
        r = subprocess.run([GIFTC, "decode", out, "-o", self.path("d.safetensors")],
                           capture_output=True, text=True, preexec_fn=small_files)
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("d.safetensors: cannot reserve space: File too large", r.stderr)
        self.assertEqual(sorted(os.listdir(self.dir)), ["in.safetensors", "out.gift"])
        os.unlink(out)
        # SIGINT part-way: either it finished (a complete frame) or there is no file at all,
        # and never a temporary.
        big = self.path("big.safetensors")
        save_file({f"t{i}": np.ones((2048, 2048), np.float32) for i in range(8)}, big)
        # An input truncated under giftc's mapping faults with SIGBUS: reported as an I/O
        # error (exit status 3), nothing written. Truncated before giftc read its header, it is
        # a file too short for its header (status 2); done before, a whole frame.
        shrinking = self.path("shrinking.safetensors")
        save_file({f"t{i}": np.ones((2048, 2048), np.float32) for i in range(8)}, shrinking)
        # Both threads may fault: the message comes once.
        p = subprocess.Popen([GIFTC, "encode", shrinking, "-o", out, "--threads", "2"],
                             stderr=subprocess.PIPE, text=True)
        time.sleep(0.05)
        os.truncate(shrinking, 1 << 20)
        _, err = p.communicate()
        if p.returncode == 3:
            self.assertEqual(err.count("shrank while it was being read"), 1, err)
        elif p.returncode == 2:
            self.assertIn("out of bounds", err)
        else:
            self.assertEqual(p.returncode, 0, err)
            os.unlink(out)
        self.assertNotIn("out.gift", os.listdir(self.dir))
        os.unlink(shrinking)
        p = subprocess.Popen([GIFTC, "encode", big, "-o", out, "--threads", "1"],
                             stderr=subprocess.PIPE)
        time.sleep(0.15)
        p.send_signal(signal.SIGINT)
        rc = p.wait()
        left = sorted(os.listdir(self.dir))
        if rc == 0 or "out.gift" in left:
            # Finished: the signal came too late, or after the frame was named (then it still
            # ends the process, with the whole frame in place).
            self.assertIn(rc, (0, -signal.SIGINT))
            self.assertEqual(run("inspect", out, "--verify", "-q").returncode, 0)
            self.assertEqual(left, ["big.safetensors", "in.safetensors", "out.gift"])
        else:
            self.assertEqual(rc, -signal.SIGINT)
            self.assertEqual(left, ["big.safetensors", "in.safetensors"])

    def test_outputs_are_synced_only_with_fsync(self):
        # Like cp, gzip and zstd, giftc leaves its outputs to the kernel's writeback; with
        # --fsync, each output is synced whole before it takes its name, and its folder after
        # (a preloaded shim logs every sync call with the size of the file it syncs).
        log = self.path("sync.log")
        env = self.preloading("sync_log", GIFT_SYNC_LOG=log)
        src = self.path("in.safetensors")
        save_file({"w": np.random.default_rng(4).standard_normal((2048, 2048), dtype=np.float32)},
                  src)
        commands = {  # output: arguments; the decoded file (16 MiB) gets writeback started
            "out.gift": ["encode", src],
            "out.safetensors": ["decode", self.path("out.gift")],
            "out.giftb": ["fit", src],
        }
        for fsync in (False, True):
            for out, args in commands.items():
                with self.subTest(command=args[0], fsync=fsync):
                    if os.path.exists(log):
                        os.unlink(log)
                    dest = self.path(out)
                    r = subprocess.run([GIFTC, *args, "-o", dest, "-q", "-f"] +
                                       (["--fsync"] if fsync else []),
                                       env=env, capture_output=True, text=True)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    calls = pathlib.Path(log).read_text().split("\n")[:-1] \
                        if os.path.exists(log) else []
                    if not fsync:
                        self.assertEqual(calls, [])
                        continue
                    # The file, then its folder (where the new name is recorded).
                    self.assertEqual(calls[-2:], [f"fsync {os.path.getsize(dest)}", "fsync folder"])
                    self.assertEqual([c for c in calls[:-2] if not c.startswith(
                        "sync_file_range ")], [])
                    if args[0] == "decode":
                        self.assertGreaterEqual(len(calls), 2, "writeback started as it goes")

    def test_a_signal_removes_the_temporary_where_files_cannot_be_unnamed(self):
        # File systems without O_TMPFILE (NFS, many FUSE ones; here a preloaded shim makes
        # open(O_TMPFILE) fail) get outputs written as OUT.tmp.XXXXXXXX: a finished run
        # renames it, an interrupted or terminated one removes it.
        import signal
        import time

        env = self.preloading("no_tmpfile")
        src = self.path("in.safetensors")
        rng = np.random.default_rng(9)
        save_file({"w": rng.standard_normal((2048, 2048), dtype=np.float32)}, src)
        out = self.path("out.gift")
        r = subprocess.run([GIFTC, "encode", src, "-o", out, "-q"], env=env, capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(os.listdir(self.dir)), ["in.safetensors", "no_tmpfile.so",
                                                        "out.gift"])
        self.assertEqual(run("inspect", out, "--verify", "-q").returncode, 0)
        os.unlink(out)

        def temporary_written():
            for n in os.listdir(self.dir):
                try:
                    if n.startswith("out.gift.tmp.") and os.path.getsize(self.path(n)) > 0:
                        return True
                except FileNotFoundError:
                    pass
            return False

        for sig in (signal.SIGINT, signal.SIGTERM):
            p = subprocess.Popen([GIFTC, "encode", src, "-o", out, "--zstd=19", "--threads", "1"],
                                 env=env, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 60
            while not temporary_written():  # the path is taken, and the output recorded
                self.assertIsNone(p.poll(), "finished before its temporary was seen")
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.002)
            p.send_signal(sig)
            p.communicate()
            self.assertEqual(p.returncode, -sig)
            self.assertEqual(sorted(os.listdir(self.dir)), ["in.safetensors", "no_tmpfile.so"])

    @unittest.skipUnless(os.environ.get("GIFT_LARGE_TESTS") == "1",
                         "GIFT_LARGE_TESTS=1: writes about 26 GB and takes minutes")
    def test_a_tensor_past_2_to_the_32_elements_in_files_past_4_gib(self):
        # A bf16 tensor of 2^32 + 2^16 elements (8 GiB, a sparse file of zeros with a few
        # values placed past element 2^32): its frame (4 GiB of codes) and decoded file keep
        # every element where it belongs.
        rows, cols = 65537, 65536
        header = json.dumps({"g": {"dtype": "BF16", "shape": [rows, cols],
                                   "data_offsets": [0, rows * cols * 2]}}).encode()
        header += b" " * ((8 - len(header) % 8) % 8)
        src = self.path("huge.safetensors")
        start = 8 + len(header)
        placed = {5: 2.0, (1 << 32) + 7: -3.0, rows * cols - 1: 0.5}
        with open(src, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header)
            f.truncate(start + rows * cols * 2)
            for index, value in placed.items():
                f.seek(start + 2 * index)
                f.write(np.array([value], ml_dtypes.bfloat16).tobytes())
        frame, out = self.path("huge.gift"), self.path("huge.out.safetensors")
        r = run("encode", src, "-o", frame, "--scale", "row", "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertGreater(os.path.getsize(frame), 1 << 32)
        os.unlink(src)
        info = json.loads(run("inspect", frame, "--json").stdout)
        self.assertEqual(info["tensors"][0]["shape"], [rows, cols])
        r = run("decode", frame, "-o", out, "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        os.unlink(frame)
        with open(out, "rb") as f:
            hlen = struct.unpack("<Q", f.read(8))[0]
        data = np.memmap(out, dtype=np.uint16, mode="r", offset=8 + hlen)
        self.assertEqual(data.size, rows * cols)
        for index, value in placed.items():
            got = float(np.array([data[index]], np.uint16).view(ml_dtypes.bfloat16)[0])
            self.assertAlmostEqual(got, value, delta=abs(value) * 0.07, msg=index)
        # The rest of the last row (which holds element 2^32 + 7 and the last element) and
        # of the first row stayed zero.
        self.assertEqual(int(np.count_nonzero(data[-cols:])), 2)
        self.assertEqual(int(np.count_nonzero(data[:cols])), 1)

    def test_default_decode_name_never_aims_at_the_original(self):
        src = self.path("grads.safetensors")
        save_file({"w": np.ones((4, 64), np.float32)}, src)
        self.assertEqual(run("encode", src, "-q").returncode, 0)
        r = run("decode", src + ".gift", "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(self.path("grads.decoded.safetensors")))
        npy = self.path("one.npy")
        np.save(npy, np.ones((4, 64), np.float32))
        self.assertEqual(run("encode", npy, "-q").returncode, 0)
        self.assertEqual(run("decode", npy + ".gift", "-q").returncode, 0)
        self.assertTrue(os.path.exists(self.path("one.decoded.npy")))

    def test_nonfinite_values_in_lossless_tensors_are_an_error_too(self):
        src = self.path("v.npy")
        np.save(src, np.array([1, np.nan, 3, np.inf], np.float32))
        out = self.path("v.gift")
        r = run("encode", src, "-o", out)
        self.assertEqual(r.returncode, 2)
        self.assertIn("tensor 'v': 2 non-finite values in the input, the first at index 1", r.stderr)
        self.assertFalse(os.path.exists(out))
        self.assertEqual(run("encode", src, "-o", out, "--keep-nonfinite", "-q").returncode, 0)
        stats = json.loads(run("inspect", out, "--json").stdout)["tensors"][0]["stats"]
        self.assertEqual((stats["amax"], stats["nonfinite"]), (3.0, 2))

    def test_safetensors_empty_tensors_are_read_and_duplicate_names_refused(self):
        # What the safetensors package writes for an empty tensor is valid.
        src = self.path("e.safetensors")
        save_file({"z_empty": np.zeros((0, 64), np.float32), "a": np.ones((4, 64), np.float16)}, src)
        self.assertEqual(run("encode", src, "-q").returncode, 0)
        self.assertEqual(run("decode", src + ".gift", "-o", self.path("e2.safetensors"), "-q").returncode, 0)
        back = load_file(self.path("e2.safetensors"))
        self.assertEqual(back["z_empty"].shape, (0, 64))
        np.testing.assert_array_equal(back["a"], np.ones((4, 64), np.float16))
        # A header naming a tensor twice is refused, not read as its last entry.
        h = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
        dup = self.path("d.safetensors")
        with open(dup, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + bytes(4))
        r = run("encode", dup, "-o", self.path("d.gift"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("names 'a' twice", r.stderr)

    def test_a_tensor_of_no_elements_and_2_to_58_rows_takes_no_time(self):
        # Every command walked such a tensor in bands of rows: 2^37 of them, weeks of work.
        h = b'{"z":{"dtype":"F32","shape":[288230376151711744,0],"data_offsets":[0,0]}}'
        src = self.path("z.safetensors")
        with open(src, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
        frame, out = self.path("z.gift"), self.path("z2.safetensors")
        for args in (("encode", src, "-o", frame), ("decode", frame, "-o", out),
                     ("compare", src, frame), ("inspect", frame, "--verify")):
            r = subprocess.run([GIFTC, "-q", *args], capture_output=True, text=True, timeout=20)
            self.assertEqual(r.returncode, 0, f"{args[0]}: {r.stderr}")
        with open(out, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            self.assertEqual(json.loads(f.read(n))["z"]["shape"], [2**58, 0])
        r = run("inspect", frame)
        self.assertIn("GIFT frame 1.0, Tensors, 1 tensor, producer", r.stdout)

    def test_json_output_survives_file_names_that_are_not_utf8(self):
        # nlohmann refused to dump such a name: no JSON at all, exit 2 ("corrupt input").
        name = os.path.join(os.fsencode(self.dir), b"\xff.safetensors")
        save_file({"w": np.ones((4, 64), np.float32)}, os.fsdecode(name))
        r = subprocess.run([os.fsencode(GIFTC), b"encode", b"-q", name], capture_output=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        for args in ((b"inspect", name + b".gift", b"--json"),
                     (b"compare", name, name + b".gift", b"--json")):
            r = subprocess.run([os.fsencode(GIFTC), *args], capture_output=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            doc = json.loads(r.stdout.decode("utf-8"))
            self.assertIn("\ufffd", json.dumps(doc, ensure_ascii=False))

    def test_a_npy_file_name_that_is_not_utf8_names_its_tensor_escaped(self):
        # Its tensor is named for the file, and was refused as "not UTF-8 without NUL".
        x = np.random.default_rng(8).standard_normal((4, 64)).astype(np.float32)
        name = os.path.join(os.fsencode(self.dir), b"w\xe9.npy")
        np.save(os.fsdecode(name), x)
        frame, back = self.path("w.gift"), self.path("back.npy")
        r = subprocess.run([os.fsencode(GIFTC), b"encode", b"-q", name, b"-o", os.fsencode(frame)],
                           capture_output=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(run("inspect", frame, "--json").stdout)
        self.assertEqual([t["name"] for t in doc["tensors"]], ["w\\xe9"])
        self.assertEqual(run("decode", frame, "-o", back, "-q").returncode, 0)
        np.testing.assert_array_equal(np.load(back), model_block_e4m3(x))

    def test_compare_says_an_a_that_is_not_semi_definite_has_no_a_norm(self):
        # A symmetric A with a positive diagonal but a negative eigenvalue gave rel_anorm '-'
        # as if there were no A, silently (or a plausible number where it stayed positive).
        rng = np.random.default_rng(2)
        w = rng.standard_normal((64, 32)).astype(np.float32)
        src, frame, acts = self.path("w.safetensors"), self.path("w.gift"), self.path("a.safetensors")
        save_file({"v": w, "w": w.copy()}, src)
        x = rng.standard_normal((256, 32))
        good = (x.T @ x / 256).astype(np.float32)
        bad = np.zeros((32, 32), np.float32)
        bad[0, 0] = bad[1, 1] = 1e-6
        bad[0, 1] = bad[1, 0] = 1.0
        save_file({"v": good, "w": bad}, acts)
        self.assertEqual(run("encode", src, "-o", frame, "-q").returncode, 0)
        r = run("compare", src, frame, "--activations", acts, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("tensor 'w': giftComputeErrorMetrics: A is not positive semi-definite: the "
                      "A-norm squared of the reference is negative (", r.stderr)
        self.assertIn("): no rel_anorm for it\n", r.stderr)
        self.assertEqual(r.stderr.count("warning"), 1)  # once for the tensor, not per piece
        doc = json.loads(r.stdout)
        by = {t["name"]: t for t in doc["tensors"]}
        self.assertIsNone(by["w"]["rel_anorm"])
        self.assertEqual(doc["total"]["rel_anorm"], by["v"]["rel_anorm"])  # w left out
        decoded = self.path("d.safetensors")
        self.assertEqual(run("decode", frame, "-o", decoded, "-q").returncode, 0)
        e = load_file(decoded)["v"].astype(np.float64) - w
        want = math.sqrt(np.trace(e @ good @ e.T) / np.trace(w @ good @ w.T))
        self.assertAlmostEqual(by["v"]["rel_anorm"], want, delta=1e-5 * want)
        # A tensor of two bands (2^21 elements each) whose second one shows A indefinite: the
        # first band's A-norm sums, already counted, go too; one warning; every other metric
        # as without an A.
        rows = 2 * (1 << 21) // 32
        big = np.ones((rows, 32), np.float32)
        big[:, 2:] = rng.standard_normal((rows, 30)).astype(np.float32)
        big[rows // 2:, 1] = -1  # (1, -1, 0, ...): a norm squared of -1 a row, 2 its diagonal
        big[rows // 2:, 2:] = 0
        src2, frame2, acts2 = (self.path("big.safetensors"), self.path("big.gift"),
                               self.path("a2.safetensors"))
        save_file({"w": big}, src2)
        bad2 = np.eye(32, dtype=np.float32)
        bad2[0, 1] = bad2[1, 0] = 1.5
        save_file({"w": bad2}, acts2)
        self.assertEqual(run("encode", src2, "-o", frame2, "-q").returncode, 0)
        r = run("compare", src2, frame2, "--activations", acts2, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.count("warning"), 1, r.stderr)
        with_a = json.loads(r.stdout)["tensors"][0]
        self.assertIsNone(with_a["rel_anorm"])
        without = json.loads(run("compare", src2, frame2, "--json").stdout)["tensors"][0]
        self.assertEqual(with_a, without)
        # A semi-definite but singular A is no warning.
        y = rng.standard_normal((2, 32))
        save_file({"v": good, "w": (y.T @ y).astype(np.float32)}, acts)
        r = run("compare", src, frame, "--activations", acts)
        self.assertEqual((r.returncode, r.stderr), (0, ""))

    def test_a_file_without_an_extension_is_told_by_its_first_bytes(self):
        # A missing file without an extension was "unknown file type" (status 2), not one that
        # cannot be opened (3); an existing one was refused (fit) or read as a frame (compare).
        rng = np.random.default_rng(9)
        w = rng.standard_normal((64, 64)).astype(np.float32)
        st, npy, frame = self.path("w_st"), self.path("w_npy"), self.path("w_frame")
        save_file({"w": w}, st)
        np.save(npy + ".npy", w)
        os.rename(npy + ".npy", npy)
        for args in (("fit", self.path("none"), "-o", self.path("b.giftb")),
                     ("encode", self.path("none")), ("compare", self.path("none"), st),
                     ("compare", st, self.path("none"))):
            r = run(*args)
            self.assertEqual(r.returncode, 3, args)
            self.assertIn("none: cannot open: No such file or directory", r.stderr)
        self.assertEqual(run("encode", st, "-o", frame, "-q").returncode, 0)
        self.assertEqual(run("fit", st, "-o", self.path("b.giftb"), "-q").returncode, 0)
        for ref, other in ((st, frame), (frame, st), (npy, frame), (st, npy)):
            doc = json.loads(run("compare", ref, other, "--json").stdout)
            self.assertEqual(len(doc["tensors"]), 1, (ref, other))
        self.assertEqual(json.loads(run("compare", st, npy, "--json").stdout)["total"]["rel_l2"],
                         0)
        r = run("encode", npy, "-o", self.path("n.gift"), "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(run("inspect", self.path("n.gift"), "--json").stdout)
                         ["tensors"][0]["name"], "w_npy")
        junk = self.path("junk")
        with open(junk, "wb") as f:
            f.write(b"not a tensor file at all")
        for args in (("encode", junk), ("compare", st, junk)):
            r = run(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn("junk: unknown file type (expected .safetensors, .npy or .npz, by its "
                          "name or its first bytes)", r.stderr)

    def test_a_tensor_without_rows_has_its_sections_checked_too(self):
        # decode and compare never read the sections of a [0, 64] tensor, so that a damaged
        # checksum there passed them while inspect --verify refused the frame.
        import xxhash
        src, frame, bad = self.path("z.safetensors"), self.path("z.gift"), self.path("zb.gift")
        save_file({"z": np.zeros((0, 64), np.float32), "w": np.ones((4, 64), np.float32)}, src)
        self.assertEqual(run("encode", src, "-o", frame, "-q").returncode, 0)
        with open(frame, "rb") as f:
            data = bytearray(f.read())
        length = struct.unpack_from("<I", data, 12)[0]
        empty = struct.pack("<Q", xxhash.xxh3_64_intdigest(b""))
        header = bytes(data[32:32 + length])
        self.assertEqual(header.count(empty), 2)  # the empty codes and scales of 'z'
        data[32 + header.find(empty)] ^= 0xFF
        struct.pack_into("<Q", data, 16, xxhash.xxh3_64_intdigest(bytes(data[32:32 + length])))
        with open(bad, "wb") as f:
            f.write(data)
        for args in (("inspect", bad, "--verify"), ("decode", bad, "-o", self.path("d.safetensors")),
                     ("compare", src, bad)):
            r = run(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn("zb.gift: tensor 'z': ", r.stderr)
            self.assertIn("section: checksum mismatch (the data is damaged)", r.stderr)
        self.assertFalse(os.path.exists(self.path("d.safetensors")))
        for args in (("decode", frame, "-o", self.path("d.safetensors")), ("compare", src, frame)):
            self.assertEqual(run(*args).returncode, 0, args)
        self.assertEqual(load_file(self.path("d.safetensors"))["z"].shape, (0, 64))
        # Its ratio in inspect's table is -, also where its one scale takes bytes.
        r = run("encode", src, "-o", self.path("t.gift"), "--scale", "tensor", "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(run("inspect", self.path("t.gift")).stdout, r"\nz +\[0,64\] .* 4 B +-\n")

    def test_inspect_json_prints_its_document_as_one_dump_would(self):
        # The tensors are printed as they are read, around the rest of the document (one
        # document of 200,000 tensors took 600 MB): the text must be the standard indented form
        # of what it parses to (numbers aside: two shortest round-trip printers may pick other
        # digits), for no tensor, one, and several.
        rng = np.random.default_rng(6)
        number = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")
        for count in (0, 1, 3):
            src, frame = self.path(f"t{count}.safetensors"), self.path(f"t{count}.gift")
            if count == 1:  # named as the mark the tensors are printed at, and a tensor too
                frame = self.path("elements go here")
            tensors = {f"w{i}": rng.standard_normal((4, 8)).astype(np.float32) for i in range(count)}
            if count == 1:
                tensors['\n  "tensors": "elements go here"'] = tensors.pop("w0")
            save_file(tensors, src, metadata={"k": "v"} if count else None)
            self.assertEqual(run("encode", src, "-o", frame, "-q").returncode, 0)
            r = run("inspect", frame, "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            doc = json.loads(r.stdout)
            self.assertEqual([t["name"] for t in doc["tensors"]], sorted(tensors))
            self.assertEqual(doc["totals"]["tensors"], count)
            again = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
            self.assertEqual(number.sub("#", r.stdout), number.sub("#", again))

    def test_inspect_verifies_a_frame_whose_basis_travels_apart(self):
        # Encoded with --basis and without --embed-basis, a frame could not be verified at all.
        rng = np.random.default_rng(4)
        src, other = self.path("g.safetensors"), self.path("h.safetensors")
        mix = rng.standard_normal((64, 64)).astype(np.float32) * np.logspace(-2, 1, 64, dtype=np.float32)
        save_file({"w": rng.standard_normal((256, 64)).astype(np.float32) @ mix}, src)
        save_file({"w": rng.standard_normal((256, 64)).astype(np.float32) @ mix}, other)
        basis, frame = self.path("b.giftb"), self.path("g.gift")
        self.assertEqual(run("fit", src, "-o", basis, "-q").returncode, 0)
        self.assertEqual(run("encode", src, "--basis", basis, "--coords", "gift", "-o", frame,
                             "-q").returncode, 0)
        r = run("inspect", frame, "--verify", "-q")
        self.assertEqual(r.returncode, 4, r.stderr)
        # The basis's own id, which that error names, is in its inspect too.
        wanted = re.search(r"encoded in basis ([0-9a-f]{32})", r.stderr)
        self.assertIsNotNone(wanted, r.stderr)
        ident = wanted.group(1)
        self.assertIn(f"  basis {ident} (1 whitener)\n", run("inspect", basis).stdout)
        with open(basis, "rb") as f:
            doc = json.loads(subprocess.run([GIFTC, "inspect", "-", "--json"], stdin=f,
                                            capture_output=True, text=True).stdout)
        self.assertEqual((doc["kind"], doc["basis_id"], doc["whiteners"]), ("Basis", ident, 1))
        # A damaged basis is still described (its id unreadable), and --verify --json says why.
        with open(basis, "rb") as f:
            damaged = bytearray(f.read())
        damaged[-3] ^= 1
        bad_basis = self.path("bad.giftb")
        with open(bad_basis, "wb") as f:
            f.write(damaged)
        r = run("inspect", bad_basis)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("  basis id unreadable (its sections do not load: --verify says why)",
                      r.stdout)
        r = run("inspect", bad_basis, "--verify", "--json")
        self.assertEqual(r.returncode, 2, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual((doc["basis_id"], doc["verified"]), (None, False))
        self.assertIn("checksum mismatch", doc["verify_error"]["message"])
        r = run("inspect", frame, "--verify", "--basis", basis, "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        # With --json, a frame that fails its verification is still described, with the
        # failure, and the exit status is the same; it printed no JSON.
        r = run("inspect", frame, "--verify", "--json")
        self.assertEqual(r.returncode, 4, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual([t["name"] for t in doc["tensors"]], ["w"])
        self.assertFalse(doc["verified"])
        self.assertEqual(doc["verify_error"]["exit_status"], 4)
        self.assertIn(doc["verify_error"]["message"], r.stderr)
        self.assertTrue(json.loads(run("inspect", frame, "--verify", "--json", "--basis", basis)
                                   .stdout)["verified"])
        with open(frame, "rb") as f:
            data = bytearray(f.read())
        data[-1] ^= 0x40  # the last section's last byte
        bad = self.path("bad.gift")
        with open(bad, "wb") as f:
            f.write(data)
        r = run("inspect", bad, "--verify", "--json", "--basis", basis)
        self.assertEqual(r.returncode, 2, r.stderr)
        doc = json.loads(r.stdout)
        self.assertFalse(doc["verified"])
        self.assertEqual(doc["verify_error"]["exit_status"], 2)
        self.assertIn("checksum mismatch", doc["verify_error"]["message"])
        r = run("inspect", bad, "--verify", "--basis", basis)  # the table is not printed
        self.assertEqual((r.returncode, r.stdout), (2, ""))
        wrong = self.path("other.giftb")
        self.assertEqual(run("fit", other, "-o", wrong, "-q").returncode, 0)
        r = run("inspect", frame, "--verify", "--basis", wrong, "-q")
        self.assertEqual(r.returncode, 4, r.stderr)
        r = run("inspect", frame, "--basis", basis)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--basis is for --verify", r.stderr)

    def test_fit_leaves_out_a_tensor_whose_moment_is_zero(self):
        # A frozen layer's zero gradient failed the whole fit ("A has no positive diagonal to
        # damp against"); it is left out, with a warning, and stays Euclidean.
        rng = np.random.default_rng(8)
        src, acts = self.path("z.safetensors"), self.path("za.safetensors")
        save_file({"good": rng.standard_normal((64, 32)).astype(np.float32),
                   "frozen": np.zeros((64, 32), np.float32)}, src)
        save_file({"good": np.eye(32, dtype=np.float32),
                   "frozen": np.zeros((32, 32), np.float32)}, acts)
        basis, frame = self.path("z.giftb"), self.path("z.gift")
        for extra in ((), ("--damping", "0.1"), ("--damping-absolute", "--damping", "0.1"),
                      ("--activations", acts)):
            r = run("fit", src, "-o", basis, "-f", *extra)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("warning: 1 tensor with a zero second moment (frozen): no whitener, it "
                          "stays Euclidean wherever the basis is used", r.stderr)
            self.assertIn(": 1 whitener (", r.stderr)
            names = {t["name"].split("#")[0] for t in
                     json.loads(run("inspect", basis, "--json").stdout)["tensors"]}
            self.assertEqual(names, {"good"})
        r = run("encode", src, "--basis", basis, "--coords", "gift", "-o", frame)
        self.assertEqual(r.returncode, 0, r.stderr)
        coords = {t["name"]: t["coords"]
                  for t in json.loads(run("inspect", frame, "--json").stdout)["tensors"]}
        self.assertEqual(coords, {"good": "gift", "frozen": "euclidean"})
        # A zero A without a gradient to measure on is left out, not also "unmeasured".
        save_file({"good": rng.standard_normal((64, 32)).astype(np.float32)}, src)
        r = run("fit", src, "-o", basis, "-f", "--activations", acts)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("1 tensor with a zero second moment (frozen)", r.stderr)
        self.assertNotIn("taken without measurement", r.stderr)
        save_file({"frozen": np.zeros((64, 32), np.float32)}, src)
        r = run("fit", src, "-o", basis, "-f")
        self.assertEqual(r.returncode, 2)
        self.assertIn("every tensor's second moment is zero (frozen): nothing to fit a whitener "
                      "to", r.stderr)

    def test_fit_says_which_dampings_it_could_not_measure(self):
        # --damping auto measures on the last dump: a tensor only in an older one got the first
        # candidate, and the summary said "measured per tensor".
        rng = np.random.default_rng(6)
        old, new = self.path("d1.npz"), self.path("d2.npz")
        np.savez(old, w=rng.standard_normal((64, 32)).astype(np.float32),
                 gone=rng.standard_normal((64, 32)).astype(np.float32))
        np.savez(new, w=rng.standard_normal((64, 32)).astype(np.float32))
        r = run("fit", old, new, "-o", self.path("b.giftb"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("warning: 1 tensor without a 2-D gradient in " + new + " (gone): damping 0.001, "
                      "the first candidate, taken without measurement", r.stderr)
        np.savez(new, w=rng.standard_normal((64, 32)).astype(np.float32),
                 gone=rng.standard_normal((8, 40)).astype(np.float32))  # too small to fit
        r = run("fit", old, new, "-o", self.path("c.giftb"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("tensor 'gone' has 32 columns in an earlier dump, but the gradient in " + new +
                      " has 40 columns", r.stderr)

    def test_fit_names_the_dump_and_element_of_a_nonfinite_gradient(self):
        # The message named a place in the second moment the NaN had spread through, not the
        # dump it came from; no basis is written.
        rng = np.random.default_rng(7)
        w = rng.standard_normal((64, 32)).astype(ml_dtypes.bfloat16)
        w[3, 5] = np.nan
        old, new = self.path("d1.npz"), self.path("d2.safetensors")
        np.savez(old, w=rng.standard_normal((64, 32)).astype(np.float32))
        save_file({"w": w}, new)
        r = run("fit", old, new, "-o", self.path("b.giftb"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(new + ": tensor 'w': 1 non-finite value in the input, the first at index 101 "
                      "(row 3, column 5)", r.stderr)
        self.assertFalse(os.path.exists(self.path("b.giftb")))

    def test_npz_members_are_checked_and_named_as_numpy_does(self):
        import io
        good = self.path("c.npz")
        np.savez(good, w=np.ones((4, 64), np.float32))
        with open(good, "rb") as f:
            data = bytearray(f.read())
        data[data.find(b"\x00\x00\x80\x3f") + 3] ^= 1  # one bit of a 1.0f
        bad = self.path("c_bad.npz")
        with open(bad, "wb") as f:
            f.write(data)
        with self.assertRaises(Exception):  # numpy's own verdict on the same file
            np.load(bad)["w"]
        r = run("encode", bad, "-o", self.path("c.gift"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("bad CRC-32", r.stderr)
        # A member without the .npy suffix is a tensor of that whole name, as numpy.load says.
        noext = self.path("noext.npz")
        member = io.BytesIO()
        np.save(member, np.ones((4, 64), np.float32))
        with zipfile.ZipFile(noext, "w") as z:
            z.writestr("plain", member.getvalue())
        self.assertEqual(list(np.load(noext).keys()), ["plain"])
        self.assertEqual(run("encode", noext, "-q").returncode, 0)
        names = [t["name"] for t in json.loads(run("inspect", noext + ".gift", "--json").stdout)["tensors"]]
        self.assertEqual(names, ["plain"])
        # Deflated members (savez_compressed) are checked as they are read for the encode, after
        # the members before them: one whose CRC-32 or deflate data is damaged still fails the
        # encode, as numpy fails to load it, and leaves no output.
        comp = self.path("z.npz")
        np.savez_compressed(comp, a=np.ones((4, 64), np.float32),
                            w=np.arange(4096, dtype=np.float32).reshape(64, 64))
        self.assertEqual(run("encode", comp, "-o", self.path("z.gift"), "-q").returncode, 0)
        with open(comp, "rb") as f:
            data = f.read()
        with zipfile.ZipFile(comp) as z:
            w = z.getinfo("w.npy")
        entry = [i for i in range(len(data)) if data.startswith(b"PK\x01\x02", i)
                 and data[i + 46:i + 46 + 5] == b"w.npy"][0]
        local = w.header_offset
        start = local + 30 + sum(struct.unpack("<HH", data[local + 26:local + 30]))  # name, extra
        for what, at in (("CRC-32", entry + 16), ("deflate data", start + w.compress_size // 2)):
            damaged = bytearray(data)
            damaged[at] ^= 0x10
            bad = self.path("z_bad.npz")
            with open(bad, "wb") as f:
                f.write(damaged)
            with self.assertRaises(Exception, msg=what):  # numpy's own verdict
                np.load(bad)["w"]
            before = sorted(os.listdir(self.dir))
            out = self.path("z_bad.gift")
            r = run("encode", bad, "-o", out)
            self.assertEqual(r.returncode, 2, (what, r.stderr))
            self.assertRegex(r.stderr, r"z_bad\.npz: member 'w\.npy': bad (CRC-32|deflate data)",
                             what)
            self.assertEqual(sorted(os.listdir(self.dir)), before, what)

    def test_npz_members_no_command_reads_are_checked_too(self):
        # A deflated member's CRC-32 is checked as the member is read, and members a command
        # has no use for are read to be checked before its output is complete: fit with a fixed
        # damping reads no gradient, compare no activations of a tensor it does not compare;
        # an empty tensor, no larger than its .npy header, is checked as the file is opened.
        def damaged(src, member):
            with open(src, "rb") as f:
                data = bytearray(f.read())
            entry = [i for i in range(len(data)) if data.startswith(b"PK\x01\x02", i)
                     and data[i + 46:i + 46 + len(member)] == member.encode()][0]
            data[entry + 16] ^= 0x10  # its CRC-32 in the central directory
            bad = src.replace(".npz", "_bad.npz")
            with open(bad, "wb") as f:
                f.write(data)
            with self.assertRaises(Exception, msg=member):  # numpy's own verdict
                np.load(bad)[member[:-4]]
            return bad

        rng = np.random.default_rng(8)
        x = rng.standard_normal((512, 128)).astype(np.float32)
        grads, acts = self.path("g.npz"), self.path("a.npz")
        np.savez_compressed(grads, q=rng.standard_normal((256, 128)).astype(np.float32))
        np.savez_compressed(acts, q=x.T @ x / 512, unused=np.eye(256, dtype=np.float32))
        basis = self.path("b.giftb")
        cases = [
            ("fit", damaged(grads, "q.npy"), "--activations", acts, "--damping", "0.01", "-o", basis),
            ("compare", grads, grads, "--activations", damaged(acts, "unused.npy")),
        ]
        empty = self.path("e.npz")
        np.savez_compressed(empty, e=np.zeros((0, 16), np.float32), w=np.ones((4, 16), np.float32))
        cases.append(("encode", damaged(empty, "e.npy"), "-o", self.path("e.gift")))
        for args in cases:
            before = sorted(os.listdir(self.dir))
            r = run(*args)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
            self.assertIn("bad CRC-32", r.stderr, args)
            self.assertEqual(r.stdout, "", args)
            self.assertEqual(sorted(os.listdir(self.dir)), before, args)
        # The same commands on the undamaged files succeed.
        self.assertEqual(run("fit", grads, "--activations", acts, "--damping", "0.01", "-o", basis,
                             "-q").returncode, 0)
        self.assertEqual(run("compare", grads, grads, "--activations", acts).returncode, 0)
        self.assertEqual(run("encode", empty, "-q").returncode, 0)

    def test_gift_coordinates_never_turn_finite_input_into_inf(self):
        w = (np.random.default_rng(0).standard_normal((64, 64)) * 1e37).astype(np.float32)
        w[0, 0] = np.float32(3.0e38)
        src, basis, out = self.path("big.npy"), self.path("big.giftb"), self.path("big.gift")
        np.save(src, w)
        self.assertEqual(run("fit", src, "-o", basis, "-q").returncode, 0)
        r = run("encode", src, "--basis", basis, "--coords", "gift", "-o", out, "-v")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("could overflow fp32", r.stderr)
        self.assertEqual(run("inspect", out, "--verify").returncode, 0)
        dec = self.path("big.decoded.npy")
        self.assertEqual(run("decode", out, "--basis", basis, "-o", dec, "-q").returncode, 0)
        self.assertTrue(np.isfinite(np.load(dec)).all())

    def test_control_characters_reach_a_terminal_escaped(self):
        import unicodedata
        src, out = self.path("evil.safetensors"), self.path("evil.gift")
        save_file({"evil\x1b]0;pwned\x07": np.ones((4, 64), np.float32),
                   "csi\u009b2J": np.ones((4, 64), np.float32),  # C1 CSI, in UTF-8
                   "\u00db2J": np.ones((4, 64), np.float32),  # C3 9B: CSI to an 8-bit terminal
                   "café": np.ones((4, 64), np.float32),
                   "中文名": np.ones((4, 64), np.float32)}, src,
                  metadata={"k\x1b[2J": "v"})
        self.assertEqual(run("encode", src, "-o", out, "-q").returncode, 0)
        for args in (("inspect", out), ("compare", src, out), ("decode", out, "--basis", self.path("none"))):
            seen = on_terminal(*args)
            self.assertNotIn(b"\x1b", seen, args)
        seen = on_terminal("inspect", out)
        self.assertIn(b"evil\\x1B]0;pwned\\x07", seen)
        self.assertIn(b"csi\\u009B2J", seen)
        self.assertNotIn(b"\xc2\x9b", seen)
        # The table's columns line up, counted as a terminal shows them (café's é is 2 bytes and
        # one column, each of 中文名's characters 3 bytes and two columns).
        def column(line, at):
            return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in line[:at])
        rows = [line for line in seen.decode().splitlines() if "[4,64]" in line]
        self.assertEqual(len(rows), 5, seen)
        self.assertEqual(len({column(line, line.index("[4,64]")) for line in rows}), 1, rows)
        # Where the locale is not UTF-8, every byte past ASCII: \u00db's C3 9B held a CSI.
        seen = on_terminal("inspect", out, locale="C")
        self.assertTrue(all(b < 0x80 for b in seen), seen)
        self.assertIn(b"caf\\xC3\\xA9", seen)
        # A file name that is not UTF-8 (0x9B alone is CSI to an 8-bit terminal) in a summary.
        odd = os.fsdecode(os.fsencode(self.path("x")) + b"\x9b2J.gift")
        seen = on_terminal("encode", src, "-o", odd)
        self.assertIn(b"x\\x9B2J.gift", seen)
        self.assertNotIn(b"\x9b", seen)
        # Through a pipe the text is as the file has it (JSON escapes it on its own).
        self.assertIn("evil\x1b]0;pwned\x07", run("inspect", out).stdout)

    def test_progress_is_cleared_before_the_summary(self):
        # On a terminal the summary followed "decode: 5/5" on its line, cleared only after it.
        rng = np.random.default_rng(15)
        src = self.path("mix.safetensors")
        save_file({f"w{i}": rng.standard_normal((64, 32)).astype(np.float32) for i in range(5)},
                  src)
        for args, summary in ((["encode", src, "-o", self.path("m.gift")], b"5 tensors (5 FP8"),
                              (["decode", self.path("m.gift"), "-o", self.path("d.safetensors")],
                               b"5 tensors -> "),
                              (["fit", src, "-o", self.path("m.giftb")], b"5 whiteners")):
            seen = on_terminal(*args)
            at = seen.index(summary)
            line = seen[seen.rindex(b"\r", 0, at) + 1:]  # from the last carriage return before it
            self.assertTrue(line.startswith(b"\x1b[K"), (args, seen))
            self.assertNotIn(b"/5", line, args)
            self.assertNotIn(b"\x1b", seen[at:], args)

    def test_encode_says_which_pattern_is_bad_and_when_include_matches_nothing(self):
        src = self.path("a.npy")
        np.save(src, np.ones((4, 64), np.float32))
        for option, pattern in (("--include", "["), ("--exclude", "(")):
            r = run("encode", src, "-o", self.path("x.gift"), option, pattern)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn(option + ": bad regular expression", r.stderr)
        r = run("encode", src, "-o", self.path("x.gift"), "--include", "zzz")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("warning: --include matches no tensor: every one is stored losslessly",
                      r.stderr)
        r = run("encode", src, "-f", "-o", self.path("x.gift"), "--include", "a")
        self.assertNotIn("warning", r.stderr)
        # Options that do nothing where they are given are said to, not taken silently.
        for args, says in ((["--margin", "0.1"], "--margin, --min-dim and --flops-budget choose "
                            "coordinates with --basis; without one they do nothing"),
                           (["--seed", "5"], "--seed is for --rounding stochastic")):
            r = run("encode", src, "-f", "-o", self.path("x.gift"), *args)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("warning: " + says, r.stderr)
        r = run("encode", src, "-f", "-o", self.path("x.gift"), "--seed", "5", "--rounding",
                "stochastic", "--min-dim", "16")
        self.assertNotIn("warning", r.stderr)
        # A file of another kind than its name says is named as such (a .npy named .safetensors
        # was "safetensors header longer than 100 MiB").
        wrong = self.path("w.safetensors")
        with open(src, "rb") as f, open(wrong, "wb") as g:
            g.write(f.read())
        r = run("encode", wrong, "-o", self.path("w.gift"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("holds a .npy file (its first bytes), not what its name's extension says",
                      r.stderr)

    def test_include_and_exclude_match_any_name_in_linear_time(self):
        # std::regex recursed per character: a 30,000-character name (a hostile file's)
        # overflowed its stack (SIGSEGV), and a pattern such as (a*)*b ran for ever. Every
        # name is now matched, in time linear in its length, as bytes.
        src = self.path("long.safetensors")
        save_file({"a" * 30000: np.ones((2, 16), np.float32),
                   "b" * 4090 + "weight": np.ones((2, 16), np.float32),
                   "caf\u00e9.w": np.ones((2, 16), np.float32)}, src)
        out = self.path("l.gift")

        def encodings(*args):
            r = subprocess.run([GIFTC, "encode", src, "-f", "-o", out, "-q", *args],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            doc = json.loads(run("inspect", out, "--json").stdout)
            return [t["encoding"] for t in doc["tensors"]]

        self.assertEqual(encodings("--include", "(a*)*b"), ["raw", "fp8", "raw"])
        self.assertEqual(encodings("--include", "^(a|aa)*$"), ["fp8", "raw", "raw"])
        self.assertEqual(encodings("--exclude", "weight$"), ["fp8", "raw", "fp8"])
        # . is one byte: the two of \u00e9 take two dots.
        self.assertEqual(encodings("--include", "^caf..\\.w$"), ["raw", "raw", "fp8"])
        self.assertEqual(encodings("--include", "^caf.\\.w$"), ["raw", "raw", "raw"])
        r = run("encode", src, "-f", "-o", out, "--include", "(?=a)")  # no lookaround in RE2
        self.assertEqual(r.returncode, 1)
        self.assertIn("--include: bad regular expression", r.stderr)

    def test_messages_say_what_is_wrong(self):
        # fit on NaN input names the count and the place, not "eigendecomposition failed".
        w = np.ones((32, 32), np.float32)
        w[3, 4] = np.nan
        src = self.path("nanfit.npy")
        np.save(src, w)
        r = run("fit", src, "-o", self.path("nf.giftb"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("nanfit.npy: tensor 'nanfit': 1 non-finite value in the input, the first at "
                      "index 100 (row 3, column 4)", r.stderr)
        # fit reports the rank its whiteners got, not an uncapped request.
        np.save(src, np.random.default_rng(3).standard_normal((32, 32)).astype(np.float32))
        r = run("fit", src, "-o", self.path("r.giftb"), "--rank", "100000")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("rank up to 32", r.stderr)
        # A frame under a tensor file's name is recognised as a frame.
        ok = self.path("ok.npy")
        np.save(ok, np.ones((4, 64), np.float32))
        self.assertEqual(run("encode", ok, "-o", self.path("frame.safetensors"), "-q").returncode, 0)
        r = run("encode", self.path("frame.safetensors"), "-o", self.path("x.gift"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("is a GIFT frame, not a tensor file", r.stderr)
        # A bf16 tensor decoded to .npy without --dtype: the tensor is named, not the option.
        bf = self.path("bf.safetensors")
        save_file({"b": np.ones((4, 64), ml_dtypes.bfloat16)}, bf)
        self.assertEqual(run("encode", bf, "-q").returncode, 0)
        r = run("decode", bf + ".gift", "-o", self.path("bf.npy"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("tensor 'b' is bf16", r.stderr)
        # compare names both shapes; a negative dimension is called one
        other = self.path("other.npy")
        np.save(other, np.ones((8, 32), np.float32))
        r = run("compare", ok, other)
        self.assertEqual(r.returncode, 2)
        self.assertIn("shape [4, 64] in " + ok + ", [8, 32] in " + other, r.stderr)
        neg = self.path("neg.safetensors")
        header = json.dumps({"t": {"dtype": "F32", "shape": [-1, 4], "data_offsets": [0, 16]}}).encode()
        with open(neg, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + bytes(16))
        r = run("encode", neg)
        self.assertEqual(r.returncode, 2)
        self.assertIn("shape holds a negative dimension", r.stderr)

    def test_decode_threads_do_not_change_the_values(self):
        src = self.path("t.npy")
        np.save(src, np.random.default_rng(1).standard_normal((300, 700)).astype(np.float32))
        self.assertEqual(run("encode", src, "-q").returncode, 0)
        outs = []
        for t in ("1", "2", "0"):
            out = self.path(f"t{t}.npy")
            self.assertEqual(run("decode", src + ".gift", "-o", out, "--threads", t, "-q").returncode, 0)
            outs.append(np.load(out).tobytes())
        self.assertEqual(outs[0], outs[1])
        self.assertEqual(outs[0], outs[2])
        self.assertEqual(run("decode", src + ".gift", "-o", self.path("x.npy"), "--threads", "-1").returncode, 1)

    def test_fewer_threads_than_processors_write_the_same_bytes(self):
        # With a processor to spare, bands are written behind from two buffers in turn: a small
        # write after a band (a short tensor, the tail of a row in parts) once returned before
        # that band's write(2) had read it, and the next band was made over it (a frame that
        # failed its checksums; a decode whose bytes differed, with no error).
        if len(os.sched_getaffinity(0)) < 2:
            self.skipTest("needs two processors")
        rng = np.random.default_rng(11)
        tensors = {"a": rng.standard_normal((1025, 1024)).astype(np.float32),
                   "b": rng.standard_normal((2, 2)).astype(np.float32),
                   "c": rng.standard_normal((4, (1 << 20) + 64)).astype(np.float32),
                   "d": rng.standard_normal((2048, 1024)).astype(np.float32)}
        src = self.path("t.safetensors")
        save_file(tensors, src)
        frames = []
        for t in ("1", "0"):
            frame = self.path(f"t{t}.gift")
            self.assertEqual(run("encode", src, "-o", frame, "--threads", t, "-q").returncode, 0)
            r = run("inspect", frame, "--verify")
            self.assertEqual(r.returncode, 0, r.stderr)
            frames.append(pathlib.Path(frame).read_bytes())
        self.assertEqual(frames[0], frames[1])
        outs = []
        for t in ("1", "0"):
            out = self.path(f"d{t}.safetensors")
            self.assertEqual(run("decode", self.path("t0.gift"), "-o", out, "--threads", t,
                                 "-q").returncode, 0)
            outs.append(pathlib.Path(out).read_bytes())
        self.assertEqual(outs[0], outs[1])

    def test_threads_bound_the_whitening_too(self):
        # --threads 1 fits and whitens on one thread, OpenBLAS's included (which on its own works
        # on one thread per processor). OpenMP's and OpenBLAS's workers stay once started, so a
        # count of threads taken after the work sees them: while fit, an encode in GIFT
        # coordinates and a decode are blocked writing into a FIFO whose pipe holds one page
        # (fit and encode write once done; decode's first tensor bytes come after its first
        # band's inverse whitening), no thread but the main one, the output's writer behind
        # (named gift-write) and encode's release of its input's pages (gift-release).
        # OPENBLAS_NUM_THREADS, where set, gives OpenBLAS's count.
        if not os.path.isdir("/proc/self/task") or len(os.sched_getaffinity(0)) < 2:
            self.skipTest("needs /proc and two processors")

        def codec_threads(pid):
            n = 0
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/comm") as c:
                        n += c.read().strip() not in ("gift-write", "gift-release")
                except OSError:  # ended meanwhile
                    pass
            return n

        fifo = self.path("out.fifo")
        os.mkfifo(fifo)

        def threads_at_the_output(args, env, safetensors=False):
            """Threads of giftc ARGS -o FIFO once its output's first byte has come (for a
            safetensors output, the first byte after its header), and all that it wrote."""
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # never blocks, giftc or not
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 4096)
            p = subprocess.Popen([GIFTC, *args, "-o", fifo, "--threads", "1", "-q"], env=env)
            got, deadline, tasks = b"", time.monotonic() + 120, None
            skip = math.inf if safetensors else 0  # the header's length, once read
            try:
                while True:
                    select.select([fd], [], [], 0.05)
                    try:
                        chunk = os.read(fd, 1 if tasks is None and len(got) <= skip else 1 << 16)
                    except BlockingIOError:
                        chunk = None
                    if chunk:
                        got += chunk
                        if safetensors and len(got) == 8:
                            skip = 8 + struct.unpack("<Q", got)[0]
                        if tasks is None and len(got) > skip:
                            time.sleep(0.2)  # the writer fills the page and waits
                            tasks = codec_threads(p.pid)
                            self.assertIsNone(p.poll(), f"{args}: ended before it was counted")
                    elif chunk == b"":  # no writer yet, or none any more
                        if p.poll() is not None:
                            break
                        time.sleep(0.005)
                    self.assertLess(time.monotonic(), deadline, args)
            finally:
                os.close(fd)
            self.assertEqual(p.wait(timeout=60), 0, args)
            self.assertIsNotNone(tasks, args)
            return tasks, got

        env = {k: v for k, v in os.environ.items()
               if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")}
        rng = np.random.default_rng(5)
        w = rng.standard_normal((4096, 512)).astype(np.float32)
        src, basis, frame = self.path("t.safetensors"), self.path("t.giftb"), self.path("t.gift")
        save_file({"w": w, "v": rng.standard_normal((2048, 256)).astype(np.float32)}, src)
        tasks, written = threads_at_the_output(["fit", src], env)
        self.assertEqual(tasks, 1)
        with open(basis, "wb") as f:
            f.write(written)
        tasks, written = threads_at_the_output(
            ["encode", src, "--basis", basis, "--coords", "gift"], env)
        self.assertEqual(tasks, 1)
        with open(frame, "wb") as f:
            f.write(written)
        self.assertEqual(threads_at_the_output(["decode", frame, "--basis", basis], env,
                                               safetensors=True)[0], 1)
        # OPENBLAS_NUM_THREADS gives OpenBLAS's count, where giftc's BLAS (which libgift loads
        # by its soname, as this does) is a threaded OpenBLAS.
        import ctypes
        try:
            blas = ctypes.CDLL("libopenblas.so.0")
        except OSError:
            blas = None
        if blas is not None and hasattr(blas, "openblas_get_parallel"):
            if blas.openblas_get_parallel() == 1:
                self.assertEqual(threads_at_the_output(
                    ["fit", src], dict(env, OPENBLAS_NUM_THREADS="2"))[0], 2)

    def one_processor_cgroup(self):
        """A new cgroup whose CPU quota is one processor's time, made for this test and removed
        after it; returns a preexec_fn that moves the child process into it. Skips the test where
        none can be made (not root, or no cpu controller that can be written)."""
        with open("/proc/self/mountinfo") as m:
            mounts = [line.split() for line in m]
        for f in mounts:
            if "-" not in f[6:]:
                continue
            dash = f.index("-", 6)
            fstype, point = f[dash + 1], f[4].replace("\\040", " ")
            if fstype == "cgroup" and "cpu" in f[dash + 3].split(","):
                quota = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}
            elif fstype == "cgroup2":
                try:
                    with open(os.path.join(point, "cgroup.subtree_control")) as c:
                        if "cpu" not in c.read().split():
                            continue
                except OSError:
                    continue
                quota = {"cpu.max": "100000 100000"}
            else:
                continue
            path = os.path.join(point, f"giftc-test-{os.getpid()}")
            try:
                os.mkdir(path)
            except OSError:
                continue
            self.addCleanup(os.rmdir, path)
            try:
                for name, value in quota.items():
                    with open(os.path.join(path, name), "w") as q:
                        q.write(value)
            except OSError:
                continue

            def join(procs=os.path.join(path, "cgroup.procs")):
                with open(procs, "w") as j:
                    j.write(str(os.getpid()))
            return join
        self.skipTest("no cgroup with a CPU quota can be made here (needs root and a cpu controller)")

    def test_default_threads_keep_to_the_cgroup_cpu_quota(self):
        # OpenMP counts the processors of the affinity only; giftc's default is one thread in a
        # cgroup allowed one processor's time: bench says so, and a decode blocked writing into a
        # FIFO that is not read runs no other thread (no OpenMP worker, and no writer behind,
        # since no processor is spare). Where the tests run (itself maybe under a quota, which
        # giftc counts too), the same decode has more than one.
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        env.pop("OMP_NUM_THREADS", None)
        r = subprocess.run([GIFTC, "bench", "--size", "4M"], env=env, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        procs = int(re.search(r" (\d+) threads?, ", r.stdout).group(1))
        if not os.path.isdir("/proc/self/task") or procs < 2:
            self.skipTest("needs /proc, and two processors where the tests run")
        join = self.one_processor_cgroup()
        src, frame = self.path("q.safetensors"), self.path("q.gift")
        save_file({"w": np.random.default_rng(6).standard_normal((2048, 2048)).astype(np.float32)}, src)
        self.assertEqual(run("encode", src, "-o", frame, "-q").returncode, 0)
        tasks = {}
        for where, preexec in (("quota", join), ("free", None)):
            r = subprocess.run([GIFTC, "bench", "--size", "4M"], env=env, capture_output=True,
                               text=True, preexec_fn=preexec)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(" 1 thread, " if preexec else f" {procs} threads, ", r.stdout)
            fifo = self.path(f"{where}.fifo")
            os.mkfifo(fifo)
            p = subprocess.Popen([GIFTC, "decode", frame, "-o", fifo, "-q"], env=env,
                                 preexec_fn=preexec)
            with open(fifo, "rb") as reader:
                time.sleep(1.0)  # the header and the first 64 KiB of the first band fill the pipe
                tasks[where] = len(os.listdir(f"/proc/{p.pid}/task"))
                reader.read()
            self.assertEqual(p.wait(timeout=60), 0)
        self.assertEqual(tasks["quota"], 1, tasks)
        self.assertGreater(tasks["free"], 1, tasks)

    def test_a_reader_that_goes_away_ends_it_as_sigpipe(self):
        # As gzip -dc | head: giftc ends by SIGPIPE, silently, when its standard output's reader
        # stops reading, whether the write was made on the main thread or behind (decode on
        # fewer threads than processors writes its bands from another, where SIGPIPE is blocked).
        import signal

        src = self.path("p.safetensors")
        save_file({"w": np.random.default_rng(4).standard_normal((2048, 2048)).astype(np.float32)}, src)
        self.assertEqual(run("encode", src, "-q").returncode, 0)
        for cmd in (["decode", src + ".gift", "--threads", "1"],
                    ["decode", src + ".gift", "--threads", str(os.cpu_count())],
                    ["encode", src, "--threads", "1"]):
            p = subprocess.Popen([GIFTC, *cmd, "-c", "-q"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
            self.assertEqual(len(p.stdout.read(1000)), 1000)
            p.stdout.close()
            err = p.stderr.read()
            self.assertEqual(p.wait(timeout=60), -signal.SIGPIPE, (cmd, err))
            self.assertEqual(err, b"", cmd)
            # Where SIGPIPE is ignored, the write's failure is reported as any other (exit 3).
            p = subprocess.Popen([GIFTC, *cmd, "-c", "-q"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE,
                                 preexec_fn=lambda: signal.signal(signal.SIGPIPE, signal.SIG_IGN))
            self.assertEqual(len(p.stdout.read(1000)), 1000)
            p.stdout.close()
            err = p.stderr.read()
            self.assertEqual(p.wait(timeout=60), 3, (cmd, err))
            self.assertIn(b"standard output: write failed: Broken pipe", err, cmd)

    def test_damaged_codes_leave_no_output(self):
        # "b" is all ones: its codes are one byte repeated (448 = 1.0 / (1/448), E4M3 0x7E),
        # a run that no other part of the frame has; one bit flipped past its first band.
        src = self.path("d.safetensors")
        save_file({"a": np.random.default_rng(3).standard_normal((1024, 1024)).astype(np.float32),
                   "b": np.ones((1024, 1024), np.float32)}, src)
        frame = self.path("d.gift")
        self.assertEqual(run("encode", src, "-o", frame, "-q").returncode, 0)
        with open(frame, "rb") as f:
            data = bytearray(f.read())
        start = data.find(b"\x7e" * 65536)
        self.assertGreater(start, 0)
        self.assertEqual(data.find(b"\x7e" * 65536, start + 1024 * 1024 - 65535), -1)
        data[start + 400000] ^= 1
        bad = self.path("d_bad.gift")
        with open(bad, "wb") as f:
            f.write(data)
        before = sorted(os.listdir(self.dir))
        for threads in ("1", "2"):
            out = self.path("d_bad.safetensors")
            r = run("decode", bad, "-o", out, "--threads", threads)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("tensor 'b': codes section: checksum mismatch", r.stderr)
            self.assertEqual(sorted(os.listdir(self.dir)), before, "no output, no temporary left")
        # Standard output cannot take back what it was given: it gets no byte of the damaged
        # tensor, only the header and the tensors before it.
        r = subprocess.run([GIFTC, "decode", bad, "-c", "--threads", "1"], capture_output=True)
        self.assertEqual(r.returncode, 2)
        (n,) = struct.unpack("<Q", r.stdout[:8])
        offsets = json.loads(r.stdout[8:8 + n])["b"]["data_offsets"]
        self.assertEqual(offsets[0], 1024 * 1024 * 4)
        self.assertEqual(len(r.stdout), 8 + n + offsets[0])
        # A write that failed first is the failure reported, also where it was written behind
        # (one thread) and only found after the next band's decode met the damage: standard
        # output capped (RLIMIT_FSIZE) within a's last band.
        import resource

        def capped():
            resource.setrlimit(resource.RLIMIT_FSIZE, ((4 << 20) - (256 << 10),) * 2)

        for threads in ("1", "2"):
            with open(self.path("capped.out"), "wb") as sink:
                r = subprocess.run([GIFTC, "decode", bad, "-c", "--threads", threads], stdout=sink,
                                   stderr=subprocess.PIPE, preexec_fn=capped)
            self.assertEqual(r.returncode, 3, (threads, r.stderr))
            self.assertIn(b"standard output: write failed: File too large", r.stderr)
        # The undamaged frame decodes whole.
        r = subprocess.run([GIFTC, "decode", frame, "-c"], capture_output=True)
        self.assertEqual(r.returncode, 0)
        self.assertEqual(len(r.stdout), 8 + n + 2 * offsets[0])

    def test_integer_options_are_read_strictly(self):
        src = self.path("in.npy")
        np.save(src, np.ones((4, 64), np.float32))
        for args, why in ((["--seed", "-5"], "not a non-negative integer"),
                          (["--seed", "18446744073709551616"], "larger than"),
                          (["--threads", "-1"], "negative"),
                          (["--threads", " -1"], "negative"),  # read as -1: was exit 2
                          (["--scale", "tile:99999999999x1"], "larger than 4294967295")):
            r = run("encode", src, "-o", self.path("x.gift"), *args)
            self.assertEqual(r.returncode, 1, args)
            self.assertIn(why, r.stderr)
        r = run("bench", "--size", "-1")
        self.assertEqual(r.returncode, 1)
        self.assertIn("not a byte count", r.stderr)
        r = run("bench", "--threads", "-1")  # the same option as the other commands'
        self.assertEqual(r.returncode, 1)
        self.assertIn("negative", r.stderr)
        for size, why in (("4X", "not a byte count"), ("M", "not a byte count"),
                          ("4 M", "not a byte count"), ("", "not a byte count"),
                          ("0K", "0K is less than 4096 bytes"), ("0", "0 is less than 4096 bytes"),
                          ("4095", "4095 is less than 4096 bytes"),
                          ("2000000000000", "larger than 1099511627776 bytes"),
                          ("2T", "larger than 1099511627776 bytes"),
                          ("99999999999999999999K", "larger than"),
                          ("18014398509481984K", "larger than")):  # 2^64 bytes: wraps to 0
            r = run("bench", "--size", size)
            self.assertEqual(r.returncode, 1, size)
            self.assertIn(why, r.stderr, size)
        self.assertFalse(os.path.exists(self.path("x.gift")))
        # NaN and Inf are refused as values, not passed on to fail later as bad data
        for value in ("nan", "inf"):
            r = run("fit", src, "--decay", value, "-o", self.path("b.giftb"))
            self.assertEqual(r.returncode, 1, value)
            self.assertIn("--decay must be in [0, 1)", r.stderr)
            r = run("fit", src, "--damping", value, "-o", self.path("b.giftb"))
            self.assertEqual(r.returncode, 1, value)
            self.assertIn("is not auto or a positive number", r.stderr)
            r = run("encode", src, "-o", self.path("x.gift"), "--flops-budget", value)
            self.assertEqual(r.returncode, 1, value)
            self.assertIn("--flops-budget must be a finite number", r.stderr)
        self.assertFalse(os.path.exists(self.path("b.giftb")))

    def test_sample_round_trip_with_every_command(self):
        sample = os.path.join(ROOT, "samples", "grad_sample.npy")
        out = self.path("s.gift")
        r = run("encode", sample, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run("inspect", out, "--json", "--verify")
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual(doc["format_version"], "1.0")
        self.assertTrue(doc["verified"])
        t = doc["tensors"][0]
        self.assertEqual((t["name"], t["shape"], t["fp8"], t["scale"]), ("grad_sample", [256, 1024], "e4m3", "block:128"))
        r = run("inspect", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"grad_sample\s+\[256,1024\]\s+f32\s+e4m3\s+block:128 f32")
        # The total is of the sections (the stored column's sum), the file's size apart.
        totals = doc["totals"]
        self.assertRegex(r.stdout, r"\ntotal .* " + re.escape(
            f"{totals['original_bytes'] / totals['stored_bytes']:.2f}") + "\n")
        self.assertRegex(r.stdout, r"\nfile \(with header, padding\) .* " + re.escape(
            f"{totals['original_bytes'] / totals['file_bytes']:.2f}") + "\n")
        dec = self.path("d.npy")
        r = run("decode", out, "-o", dec)
        self.assertEqual(r.returncode, 0, r.stderr)
        x = np.load(sample)
        y = np.load(dec)
        self.assertEqual(y.dtype, np.float32)
        self.assertTrue(np.array_equal(y.view(np.uint32), model_block_e4m3(x).view(np.uint32)))
        r = run("compare", sample, dec, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        cmp = json.loads(r.stdout)
        want = np.linalg.norm((y - x).astype(np.float64)) / np.linalg.norm(x.astype(np.float64))
        self.assertAlmostEqual(cmp["total"]["rel_l2"], want, places=12)
        self.assertAlmostEqual(cmp["tensors"][0]["max_abs"], float(np.max(np.abs(y.astype(np.float64) - x))), places=15)
        # compare also reads the frame directly
        r = run("compare", sample, out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"total\s+" + re.escape(f"{want:.4e}"))

    def test_compare_in_bands_matches_numpy(self):
        # Tensors of several bands (compare reads 2^21 elements at a time) with tiles of 3
        # rows, compared as a frame and as its decoded file: the metrics NumPy computes over
        # the whole tensors.
        rng = np.random.default_rng(11)
        ref = {"w": rng.standard_normal((1501, 2000)).astype(np.float32),
               "v": rng.standard_normal((3000, 999)).astype(np.float32)}
        src, frame, dec = self.path("r.safetensors"), self.path("r.gift"), self.path("d.safetensors")
        save_file(ref, src)
        self.assertEqual(run("encode", src, "-o", frame, "--scale", "tile:3x64", "-q").returncode, 0)
        self.assertEqual(run("decode", frame, "-o", dec, "-q").returncode, 0)
        back = load_file(dec)
        for other in (frame, dec):
            r = run("compare", src, other, "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            doc = json.loads(r.stdout)
            for t in doc["tensors"]:
                x = ref[t["name"]].astype(np.float64)
                y = back[t["name"]].astype(np.float64)
                self.assertEqual(t["elements"], x.size)
                self.assertAlmostEqual(t["rel_l2"], np.linalg.norm(y - x) / np.linalg.norm(x),
                                       delta=1e-9)
                self.assertAlmostEqual(t["max_abs"], np.max(np.abs(y - x)), delta=1e-12)
                self.assertAlmostEqual(t["bias"], np.mean(y - x), delta=1e-12)

    def test_compare_reads_two_frames_of_different_tiles_in_bands_both_allow(self):
        # Tiles of 160 and 96 rows: a band of a multiple of both (480 rows of 5000) is past
        # compare's 2^21 elements, so bands start inside one frame's tiles and must end at their
        # edge (bands of 240 rows crossed the 160-row tiles' edge at 320: compare refused the
        # frames). The metrics are NumPy's over the two frames decoded whole.
        rng = np.random.default_rng(12)
        src = self.path("t.safetensors")
        save_file({"w": rng.standard_normal((1000, 5000)).astype(np.float32)}, src)
        back = []
        for tile in ("160x128", "96x64"):
            frame, dec = self.path(f"t{tile}.gift"), self.path(f"t{tile}.safetensors")
            self.assertEqual(run("encode", src, "-o", frame, "--scale", "tile:" + tile, "-q").returncode, 0)
            self.assertEqual(run("decode", frame, "-o", dec, "-q").returncode, 0)
            back.append(load_file(dec)["w"].astype(np.float64))
        r = run("compare", self.path("t160x128.gift"), self.path("t96x64.gift"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        t = json.loads(r.stdout)["tensors"][0]
        x, y = back
        self.assertEqual(t["elements"], x.size)
        self.assertAlmostEqual(t["rel_l2"], np.linalg.norm(y - x) / np.linalg.norm(x), delta=1e-9)
        self.assertAlmostEqual(t["max_abs"], np.max(np.abs(y - x)), delta=1e-12)
        self.assertAlmostEqual(t["bias"], np.mean(y - x), delta=1e-12)

    def test_compare_takes_a_basis_for_each_frame(self):
        # Two frames in GIFT coordinates of two bases: --basis once for each, every tensor takes
        # the one it names (one --basis served both frames, so this failed); a frame that carries
        # its basis needs none. The metrics are NumPy's over the frames decoded.
        rng = np.random.default_rng(13)
        low = rng.standard_normal((256, 8)) @ rng.standard_normal((8, 256))
        src = self.path("g.safetensors")
        save_file({"w": (low + 0.01 * rng.standard_normal(low.shape)).astype(np.float32)}, src)
        back = []
        for k, rank in enumerate((8, 4)):
            basis, frame, dec = (self.path(f"b{k}.giftb"), self.path(f"f{k}.gift"),
                                 self.path(f"d{k}.safetensors"))
            self.assertEqual(run("fit", src, "-o", basis, "--rank", rank, "-q").returncode, 0)
            self.assertEqual(run("encode", src, "-o", frame, "--basis", basis, "--coords", "gift",
                                 "-q").returncode, 0)
            self.assertEqual(run("decode", frame, "-o", dec, "--basis", basis, "-q").returncode, 0)
            back.append(load_file(dec)["w"].astype(np.float64))
        self.assertEqual(run("encode", src, "-o", self.path("e1.gift"), "--basis", self.path("b1.giftb"),
                             "--coords", "gift", "--embed-basis", "-q").returncode, 0)
        want = np.linalg.norm(back[1] - back[0]) / np.linalg.norm(back[0])
        for other, bases in ((self.path("f1.gift"), ["--basis", self.path("b1.giftb"),
                                                     "--basis", self.path("b0.giftb")]),
                             (self.path("e1.gift"), ["--basis", self.path("b0.giftb")])):
            r = run("compare", self.path("f0.gift"), other, *bases, "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertAlmostEqual(json.loads(r.stdout)["total"]["rel_l2"], want, delta=1e-9)
        r = run("compare", self.path("f0.gift"), self.path("f1.gift"), "--basis", self.path("b0.giftb"))
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn("but basis file " + self.path("b0.giftb") + " has", r.stderr)

    def test_compare_writes_an_infinite_metric_as_inf(self):
        # rel_l2 of a zero reference against ones: JSON has no infinity, and null (what it was)
        # reads as a metric not measured, as rel_anorm without an A is.
        z, o = self.path("z.npy"), self.path("o.npy")
        np.save(z, np.zeros((4, 4), np.float32))
        np.save(o, np.ones((4, 4), np.float32))
        doc = json.loads(run("compare", z, o, "--json").stdout)
        self.assertEqual((doc["tensors"][0]["rel_l2"], doc["total"]["rel_l2"]), ("inf", "inf"))
        self.assertEqual((doc["tensors"][0]["max_abs"], doc["tensors"][0]["rel_anorm"]), (1.0, None))
        table = run("compare", z, o).stdout.splitlines()
        self.assertEqual(table[1].split()[:3], ["z", "inf", "0.00000000"])

    def test_compare_leaves_out_nonfinite_pairs_and_counts_them(self):
        # A reference with NaNs must not hide the error of every other element.
        a = np.random.default_rng(5).standard_normal((8, 64)).astype(np.float32)
        a[1, 2] = a[3, 4] = np.nan
        b = a * 100 + 5
        pa, pb = self.path("nan_ref.npy"), self.path("nan_dec.npy")
        np.save(pa, a)
        np.save(pb, b)
        r = run("compare", pa, pb, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        t = json.loads(r.stdout)["total"]
        self.assertEqual(t["nonfinite"], 2)
        fin = np.isfinite(a)
        want = np.linalg.norm((b - a)[fin].astype(np.float64)) / np.linalg.norm(a[fin].astype(np.float64))
        self.assertAlmostEqual(t["rel_l2"], want, delta=1e-6 * want)
        self.assertIn("2 element pair(s) hold NaN or Inf", run("compare", pa, pb).stdout)
        # Every pair non-finite: no metric, where the ratios of empty sums read as a perfect
        # match (cosine 1, rel_l2 0).
        np.save(pb, np.full_like(a, np.nan))
        t = json.loads(run("compare", pa, pb, "--json").stdout)["total"]
        self.assertEqual((t["rel_l2"], t["cosine"], t["max_abs"], t["bias"], t["nonfinite"]),
                         (None, None, None, None, a.size))
        self.assertRegex(run("compare", pa, pb).stdout, r"\ntotal +- +- +- +-\n")

    def test_safetensors_in_and_out(self):
        rng = np.random.default_rng(0)
        tensors = {
            "layers.0.weight": (rng.standard_normal((64, 300)) * 1e-2).astype(np.float32),
            "layers.0.bias": rng.standard_normal(300).astype(np.float32),
            "layers.1.weight": rng.standard_normal((32, 64)).astype(np.float16),
            "scalar": np.array(3.25, dtype=np.float32),
        }
        src = self.path("g.safetensors")
        save_file(tensors, src, metadata={"step": "1200", "model": "tiny"})
        r = run("encode", src, "--zstd=5", "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        frame = src + ".gift"
        info = json.loads(run("inspect", frame, "--json").stdout)
        kinds = {t["name"]: t["encoding"] for t in info["tensors"]}
        self.assertEqual(kinds, {"layers.0.weight": "fp8", "layers.0.bias": "raw", "layers.1.weight": "fp8", "scalar": "raw"})
        self.assertEqual(info["metadata"], {"model": "tiny", "step": "1200"})
        out = self.path("back.safetensors")
        r = run("decode", frame, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        back = load_file(out)
        self.assertEqual(set(back), set(tensors))
        for name in ("layers.0.bias", "scalar"):  # lossless, bit for bit
            self.assertEqual(back[name].dtype, tensors[name].dtype)
            self.assertEqual(back[name].shape, tensors[name].shape)
            self.assertEqual(back[name].tobytes(), tensors[name].tobytes())
        self.assertEqual(back["layers.1.weight"].dtype, np.float16)  # each tensor's own dtype
        self.assertTrue(np.array_equal(back["layers.0.weight"], model_block_e4m3(tensors["layers.0.weight"])))
        # --dtype bf16: the fp32 decode rounded to nearest even
        out16 = self.path("bf16.safetensors")
        self.assertEqual(run("decode", frame, "-o", out16, "--dtype", "bf16").returncode, 0)
        with open(out16, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            data = f.read()
        self.assertEqual(header["__metadata__"], {"model": "tiny", "step": "1200"})
        w = header["layers.0.weight"]
        self.assertEqual(w["dtype"], "BF16")
        got = np.frombuffer(data[w["data_offsets"][0]:w["data_offsets"][1]], dtype=ml_dtypes.bfloat16)
        want = model_block_e4m3(tensors["layers.0.weight"]).astype(ml_dtypes.bfloat16).reshape(-1)
        self.assertTrue(np.array_equal(got.view(np.uint16), want.view(np.uint16)))

    def test_decode_writes_any_utf8_name_and_metadata_into_the_safetensors_header(self):
        # The header's JSON is written as it goes (a document of every tensor took 500 bytes a
        # tensor): names and metadata that need escaping, or sort around __metadata__, must
        # read back as they were, through the safetensors package and a JSON parser.
        rng = np.random.default_rng(4)
        names = ["a", "B", "__metadata_", "__metadata__x", 'z"q', "back\\slash", "tab\tnl\nx",
                 "ctl\x01\x1f\x7f", "\u00e9 \u00fc \u4e2d\u6587", "emoji\U0001f600", "0", "~"]
        tensors = {n: rng.standard_normal((3, 5)).astype(np.float32) for n in names}
        tensors["half"] = rng.standard_normal((2, 2)).astype(np.float16)
        metadata = {'k"1': "v\n1", "a": "b", "\u00e9": "x\x02\\"}
        src, frame, out = self.path("w.safetensors"), self.path("w.gift"), self.path("back.safetensors")
        save_file(tensors, src, metadata=metadata)
        self.assertEqual(run("encode", src, "-o", frame, "-q", "--exclude", ".").returncode, 0)
        r = run("decode", frame, "-o", out, "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        back = load_file(out)
        self.assertEqual(set(back), set(tensors))
        for name, x in tensors.items():  # stored losslessly (--exclude .)
            self.assertEqual((back[name].dtype, back[name].tobytes()), (x.dtype, x.tobytes()), name)
        with safe_open(out, "np") as f:
            self.assertEqual(f.metadata(), metadata)
        with open(out, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            self.assertEqual((8 + n) % 8, 0)
        # Data in the frame's order, back to back from 0.
        order = [t["name"] for t in json.loads(run("inspect", frame, "--json").stdout)["tensors"]]
        self.assertEqual(sorted(order), sorted(tensors))
        spans = [header[t]["data_offsets"] for t in order]
        self.assertEqual(spans[0][0], 0)
        self.assertTrue(all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans)
        self.assertEqual(header["half"], {"dtype": "F16", "shape": [2, 2],
                                          "data_offsets": spans[order.index("half")]})

    def test_a_dump_of_many_small_tensors_round_trips(self):
        # 20,000 tensors, as a model with many experts has: every name and value back. (The
        # header's checks and the frame writer's once took time quadratic in the tensors:
        # 40,000 of them 36 s to encode.)
        n = 20000
        tensors = {f"experts.{i}.bias": np.full(3, i, dtype=np.float32) for i in range(n)}
        src = self.path("many.safetensors")
        save_file(tensors, src)
        frame, out = self.path("many.gift"), self.path("back.safetensors")
        self.assertEqual(run("encode", src, "-o", frame, "-q").returncode, 0)
        r = run("decode", frame, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"{n} tensors ->", r.stderr)
        back = load_file(out)
        self.assertEqual(set(back), set(tensors))
        for name in ("experts.0.bias", "experts.12345.bias", f"experts.{n - 1}.bias"):
            self.assertEqual(back[name].tobytes(), tensors[name].tobytes())
        # A name given twice is still found among them.
        with open(src, "rb") as f:
            hlen = struct.unpack("<Q", f.read(8))[0]
            header, data = f.read(hlen), f.read()
        twice = header.replace(b'"experts.19999.bias"', b'"experts.10000.bias"')
        bad = self.path("twice.safetensors")
        with open(bad, "wb") as f:
            f.write(struct.pack("<Q", len(twice)) + twice + data)
        r = run("encode", bad, "-o", self.path("twice.gift"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("the header names 'experts.10000.bias' twice", r.stderr)

    def test_a_tensor_named_like_safetensors_metadata_is_not_written_to_safetensors(self):
        # An .npy or .npz member may be called __metadata__; as a .safetensors key it is the
        # file's metadata, so the decode wrote a file that no reader (giftc, safetensors) takes.
        src = self.path("__metadata__.npy")
        x = np.arange(16, dtype=np.float32).reshape(4, 4)
        np.save(src, x)
        self.assertEqual(run("encode", src, "-o", self.path("m.gift"), "-q").returncode, 0)
        out = self.path("m.safetensors")
        r = run("decode", self.path("m.gift"), "-o", out)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("m.gift: tensor '__metadata__': a .safetensors file keeps that name for its "
                      "metadata (decode it to .npy)", r.stderr)
        self.assertEqual(sorted(os.listdir(self.dir)), ["__metadata__.npy", "m.gift"])
        r = run("decode", self.path("m.gift"), "-o", self.path("m.npy"), "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(np.load(self.path("m.npy")).shape, (4, 4))

    def test_npz_and_options(self):
        rng = np.random.default_rng(1)
        a = rng.standard_normal((16, 256)).astype(np.float32)
        for saver in (np.savez, np.savez_compressed):
            z = self.path("a.npz")
            saver(z, w=a, b=np.arange(5, dtype=np.float32))
            r = run("encode", z, "-f", "--fp8", "e5m2", "--scale", "tile:4x64", "--scale-dtype", "e8m0",
                    "--rounding", "stochastic", "--seed", "7", "--exclude", "^b$")
            self.assertEqual(r.returncode, 0, r.stderr)
            info = json.loads(run("inspect", z + ".gift", "--json").stdout)
            w = next(t for t in info["tensors"] if t["name"] == "w")
            self.assertEqual((w["fp8"], w["scale"], w["scale_dtype"], w["rounding"], w["seed"]),
                             ("e5m2", "tile:4x64", "e8m0", "stochastic", 7))
            r = run("compare", z, z + ".gift", "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            errs = {t["name"]: t["rel_l2"] for t in json.loads(r.stdout)["tensors"]}
            self.assertEqual(errs["b"], 0.0)
            self.assertGreater(errs["w"], 0.0)
            self.assertLess(errs["w"], 0.2)

    def test_fit_from_activations_equal_to_the_gradients_moment_gives_their_basis(self):
        # A gradient of entries in {-1, 0, 1} over 2^6 rows has a second moment W^T W / 64
        # exact in double and in fp32: given as activation statistics (fp32 and bf16, whose
        # values it also holds exactly), the fit must give the gradients' own whitener, bit
        # for bit. 1100^2 elements are widened in more than one band.
        rng = np.random.default_rng(5)
        w = rng.integers(-1, 2, size=(64, 1100)).astype(np.float32)
        a = (w.astype(np.float64).T @ w.astype(np.float64)) / 64
        self.assertTrue(np.array_equal(a.astype(np.float32).astype(np.float64), a))
        self.assertTrue(np.array_equal(a.astype(ml_dtypes.bfloat16).astype(np.float64), a))
        grads = self.path("g.safetensors")
        save_file({"proj.weight": w}, grads)
        bases = {}
        for source, acts in (("gradients", None), ("fp32", np.float32), ("bf16", ml_dtypes.bfloat16)):
            args = ["fit", grads, "--damping", "0.01", "--rank", "8", "-q"]
            if acts is not None:
                path = self.path(f"a_{source}.safetensors")
                save_file({"proj.weight": a.astype(acts)}, path)
                args += ["--activations", path]
            basis = self.path(f"{source}.giftb")
            r = run(*args, "-o", basis)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = self.path(f"{source}.safetensors")
            r = run("decode", basis, "-o", out, "-q")
            self.assertEqual(r.returncode, 0, r.stderr)
            bases[source] = load_file(out)
        self.assertEqual(sorted(bases["gradients"]), ["proj.weight#" + p for p in ("c", "c_inv", "d_rsqrt", "d_sqrt", "v")])
        for source in ("fp32", "bf16"):
            for name, v in bases["gradients"].items():
                self.assertEqual(bases[source][name].tobytes(), v.tobytes(), f"{source}: {name}")

    def test_fit_smooths_the_dumps_oldest_first(self):
        # Two dumps of gradients whose moments are exact (entries in {-1, 0, 1} over 2^6
        # rows), smoothed with decay 0.75: A = 0.75 A_1 + 0.25 A_2, exact in fp32 too. Given
        # as activation statistics, it must give the same whitener bit for bit.
        rng = np.random.default_rng(6)
        moments, dumps = [], []
        for k in range(2):
            w = rng.integers(-1, 2, size=(64, 48)).astype(np.float32)
            moments.append((w.astype(np.float64).T @ w.astype(np.float64)) / 64)
            dumps.append(self.path(f"g{k}.safetensors"))
            save_file({"proj.weight": w}, dumps[-1])
        a = 0.75 * moments[0] + 0.25 * moments[1]
        self.assertTrue(np.array_equal(a.astype(np.float32).astype(np.float64), a))
        acts = self.path("a.safetensors")
        save_file({"proj.weight": a.astype(np.float32)}, acts)
        bases = []
        for args in ((*dumps, "--decay", "0.75"), (dumps[1], "--activations", acts)):
            basis, out = self.path(f"b{len(bases)}.giftb"), self.path(f"b{len(bases)}.safetensors")
            r = run("fit", *args, "--damping", "0.01", "--rank", "4", "-o", basis, "-q")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(run("decode", basis, "-o", out, "-q").returncode, 0)
            bases.append(load_file(out))
        self.assertEqual(len(bases[0]), 5)
        for name, v in bases[0].items():
            self.assertEqual(bases[1][name].tobytes(), v.tobytes(), name)

    def test_coords_gift_says_which_tensors_of_the_basis_stay_euclidean(self):
        # --coords gift on a tensor whose whitener has another width: it stays Euclidean, as
        # inspect records, and encode now says so where it was silent.
        rng = np.random.default_rng(5)
        fit_on, src = self.path("a.safetensors"), self.path("b.safetensors")
        save_file({"w": rng.standard_normal((64, 32)).astype(np.float32)}, fit_on)
        save_file({"w": rng.standard_normal((64, 48)).astype(np.float32),
                   "other": rng.standard_normal((64, 32)).astype(np.float32)}, src)
        basis = self.path("b.giftb")
        self.assertEqual(run("fit", fit_on, "-o", basis, "-q").returncode, 0)
        r = run("encode", src, "--basis", basis, "--coords", "gift")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("giftc: warning: tensor 'w' stays in Euclidean coordinates: basis dimension "
                      "differs", r.stderr)
        self.assertNotIn("'other'", r.stderr)  # not in the basis: nothing to say
        r = run("encode", src, "--basis", basis, "--coords", "gift", "-q", "-f")
        self.assertEqual((r.returncode, r.stderr), (0, ""))

    def test_fit_and_the_gift_frame(self):
        # A basis fitted on one dump, used on the next: the same low-rank structure with fresh
        # noise (the frame must win), and fresh isotropic noise (it must not be chosen).
        rng = np.random.default_rng(0)
        s = rng.standard_normal((256, 4)) * np.array([10, 5, 2, 1])
        m = rng.standard_normal((512, 4)) / np.sqrt(512)
        structure = s @ m.T
        rms = np.sqrt(np.mean(structure ** 2))
        dumps = []
        for k in range(2):
            path = self.path(f"g{k}.safetensors")
            tensors = {"mlp.down.weight": (structure + 0.01 * rms * rng.standard_normal(structure.shape)).astype(np.float32),
                       "iso.weight": rng.standard_normal((128, 256)).astype(np.float32),
                       "bias": rng.standard_normal(512).astype(np.float32)}
            if k == 1:  # a layer the basis has never seen
                tensors["new.weight"] = rng.standard_normal((32, 64)).astype(np.float32)
            save_file(tensors, path)
            dumps.append(path)
        fit_on, src = dumps
        basis = self.path("b.giftb")
        r = run("fit", fit_on, "-o", basis, "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(run("encode", src, "--basis", basis, "-q").returncode, 0)
        frame = src + ".gift"
        info = {t["name"]: t for t in json.loads(run("inspect", frame, "--json").stdout)["tensors"]}
        self.assertEqual(info["mlp.down.weight"]["coords"], "gift")
        self.assertRegex(info["mlp.down.weight"]["basis_id"], r"^[0-9a-f]{32}$")
        sel = info["mlp.down.weight"]["selection"]
        self.assertLess(sel["gift_error"], 0.95 * sel["euclidean_error"])
        self.assertEqual(info["iso.weight"]["coords"], "euclidean")  # isotropic noise: no gain
        sel = info["new.weight"]["selection"]  # nothing to estimate with: no numbers made up
        self.assertEqual((sel["chosen"], sel["reason"], sel["euclidean_error"], sel["gift_error"]),
                         ("euclidean", "no whitener in the basis", None, None))
        table = run("inspect", frame).stdout
        self.assertIn("selection: euclidean (euclidean -, gift -) no whitener in the basis", table)
        # Measured: GIFT's error on the whitened tensor is at most 0.4x Euclidean's.
        errs = {t["name"]: t["rel_l2"] for t in json.loads(run("compare", src, frame, "--basis", basis, "--json").stdout)["tensors"]}
        self.assertEqual(run("encode", src, "-o", self.path("e.gift"), "-q").returncode, 0)
        eucl = {t["name"]: t["rel_l2"] for t in json.loads(run("compare", src, self.path("e.gift"), "--json").stdout)["tensors"]}
        self.assertLess(errs["mlp.down.weight"], 0.4 * eucl["mlp.down.weight"])
        self.assertEqual(errs["iso.weight"], eucl["iso.weight"])
        # Decoding needs that basis, or the embedded one.
        r = run("decode", frame, "-o", self.path("d.safetensors"))
        self.assertEqual(r.returncode, 4)
        self.assertIn("encoded in basis", r.stderr)
        other = self.path("other.giftb")
        self.assertEqual(run("fit", src, "-o", other, "--damping", "0.01", "-q").returncode, 0)  # another basis
        r = run("decode", frame, "--basis", other, "-o", self.path("d.safetensors"))
        self.assertEqual(r.returncode, 4)
        self.assertRegex(r.stderr, r"tensor 'mlp.down.weight': encoded in basis [0-9a-f]{32}, but basis file .*other.giftb has [0-9a-f]{32}")
        self.assertEqual(run("decode", frame, "--basis", basis, "-o", self.path("d.safetensors")).returncode, 0)
        emb = self.path("emb.gift")
        self.assertEqual(run("encode", src, "--basis", basis, "--embed-basis", "-o", emb, "-q").returncode, 0)
        self.assertEqual(run("decode", emb, "-o", self.path("d2.safetensors")).returncode, 0)
        # inspect says which frame carries a basis, and which one.
        doc = json.loads(run("inspect", emb, "--json").stdout)
        used = {t["name"]: t for t in doc["tensors"]}["mlp.down.weight"]["basis_id"]
        self.assertEqual(doc["embedded_basis"]["basis_id"], used)
        self.assertEqual(doc["embedded_basis"]["whiteners"], 2)
        self.assertIn(f"  embedded basis {used} (2 whiteners)", run("inspect", emb).stdout)
        self.assertIsNone(json.loads(run("inspect", frame, "--json").stdout)["embedded_basis"])
        self.assertNotIn("embedded basis", run("inspect", frame).stdout)
        a, b = load_file(self.path("d.safetensors")), load_file(self.path("d2.safetensors"))
        for k in a:
            self.assertTrue(np.array_equal(a[k], b[k]), k)
        # A kept NaN would spread over its row in GIFT coordinates: such tensors stay Euclidean.
        t = load_file(src)
        t["mlp.down.weight"][3, 7] = np.nan
        nan_src = self.path("nan.safetensors")
        save_file(t, nan_src)
        r = run("encode", nan_src, "--basis", basis, "--coords", "gift", "--keep-nonfinite", "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        info = {t["name"]: t for t in json.loads(run("inspect", nan_src + ".gift", "--json").stdout)["tensors"]}
        self.assertEqual(info["mlp.down.weight"]["coords"], "euclidean")
        self.assertEqual(info["mlp.down.weight"]["selection"]["reason"], "non-finite values")
        self.assertEqual(run("decode", nan_src + ".gift", "--basis", basis, "-o", self.path("n.safetensors")).returncode, 0)
        self.assertEqual(int(np.isnan(load_file(self.path("n.safetensors"))["mlp.down.weight"]).sum()), 1)
        # Activation statistics of the wrong size for a gradient are refused by name.
        acts = self.path("acts.safetensors")
        save_file({"mlp.down.weight": np.eye(256, dtype=np.float32)}, acts)
        r = run("fit", src, "--activations", acts, "-o", self.path("x.giftb"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("tensor 'mlp.down.weight' holds a 256 x 256 moment, but the gradient in", r.stderr)
        self.assertIn("has 512 columns", r.stderr)
        self.assertFalse(os.path.exists(self.path("x.giftb")))

    def test_deprecated_frame_alias(self):
        # --frame, the old name of --coords, keeps working for one release with a warning.
        rng = np.random.default_rng(1)
        structure = (rng.standard_normal((64, 4)) * np.array([10, 5, 2, 1])) @ rng.standard_normal((4, 128))
        src = self.path("g.safetensors")
        save_file({"w": (structure + 0.01 * rng.standard_normal(structure.shape)).astype(np.float32)}, src)
        basis = self.path("b.giftb")
        self.assertEqual(run("fit", src, "-o", basis, "-q").returncode, 0)
        new, old = self.path("new.gift"), self.path("old.gift")
        r = run("encode", src, "--basis", basis, "--coords", "gift", "-o", new)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("deprecated", r.stderr)
        r = run("encode", src, "--basis", basis, "--frame", "gift", "-o", old)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("warning: --frame is deprecated; use --coords", r.stderr)
        with open(new, "rb") as a, open(old, "rb") as b:
            self.assertEqual(a.read(), b.read())
        r = run("encode", src, "--basis", basis, "--frame", "gift", "-o", old, "-f", "-q")
        self.assertEqual((r.returncode, r.stderr), (0, ""))  # -q: no messages but errors
        r = run("encode", src, "--basis", basis, "-o", old, "-f", "-q", "-v")
        self.assertEqual(r.returncode, 1)
        self.assertIn("excludes", r.stderr)
        r = run("encode", src, "--basis", basis, "--frame", "gift", "--coords", "gift", "-o", self.path("both.gift"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("--frame is the old name of --coords: give one", r.stderr)
        self.assertFalse(os.path.exists(self.path("both.gift")))

    def test_real_dump_gift_frame_target(self):
        # Issue target: with a basis from same-step activation statistics and default
        # settings, --coords auto lowers the geomean relative L2 error over all 2-D tensors by
        # at least 1.3x against Euclidean, and loses on no tensor.
        s = os.path.join(ROOT, "samples")
        grads = os.path.join(s, "llama_grads.npz")
        basis = self.path("b.giftb")
        r = run("fit", grads, "--activations", os.path.join(s, "llama_acts.npz"), "-o", basis, "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(run("encode", grads, "--basis", basis, "-o", self.path("g.gift"), "-q").returncode, 0)
        self.assertEqual(run("encode", grads, "-o", self.path("e.gift"), "-q").returncode, 0)
        g = {t["name"]: t["rel_l2"] for t in json.loads(run("compare", grads, self.path("g.gift"), "--basis", basis, "--json").stdout)["tensors"]}
        e = {t["name"]: t["rel_l2"] for t in json.loads(run("compare", grads, self.path("e.gift"), "--json").stdout)["tensors"]}
        mats = [n for n in e if e[n] > 0]  # the quantized (2-D) tensors
        self.assertGreaterEqual(len(mats), 15)
        geomean = math.exp(sum(math.log(g[n] / e[n]) for n in mats) / len(mats))
        self.assertLessEqual(geomean, 1 / 1.3)
        for n in mats:
            self.assertLessEqual(g[n], e[n], n)
        # The A-norm error against NumPy's, for every tensor that has activation statistics.
        acts = os.path.join(s, "llama_acts.npz")
        r = run("compare", grads, self.path("g.gift"), "--basis", basis, "--activations", acts, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual(run("decode", self.path("g.gift"), "--basis", basis, "-o", self.path("g.safetensors")).returncode, 0)
        dec, ref, a = load_file(self.path("g.safetensors")), np.load(grads), np.load(acts)
        num = den = 0.0
        for t in doc["tensors"]:
            n = t["name"]
            if n not in a.files:
                self.assertIsNone(t["rel_anorm"], n)
                continue
            d = (dec[n] - ref[n]).astype(np.float64)
            am = a[n].astype(np.float64)
            tn, td = np.sum((d @ am) * d), np.sum((ref[n] @ am) * ref[n])
            self.assertAlmostEqual(t["rel_anorm"], math.sqrt(tn / td), delta=1e-4 * math.sqrt(tn / td))
            num, den = num + tn, den + td
        self.assertAlmostEqual(doc["total"]["rel_anorm"], math.sqrt(num / den), delta=1e-4 * math.sqrt(num / den))
        table = run("compare", grads, self.path("g.gift"), "--basis", basis, "--activations", acts).stdout
        self.assertIn("rel_anorm", table.splitlines()[0])
        bad = self.path("bad_acts.npz")
        np.savez(bad, **{"layers.0.q_proj.weight": np.eye(64, dtype=np.float32)})
        r = run("compare", grads, self.path("g.gift"), "--basis", basis, "--activations", bad)
        self.assertEqual(r.returncode, 2)
        self.assertIn("tensor 'layers.0.q_proj.weight' is [64, 64], not [128, 128] for the gradient's 128 columns", r.stderr)
        # as many values as the square, in another shape: read as the square before
        np.savez(bad, **{"layers.0.q_proj.weight": np.ones((64, 256), np.float32)})
        r = run("compare", grads, self.path("g.gift"), "--basis", basis, "--activations", bad)
        self.assertEqual(r.returncode, 2)
        self.assertIn("tensor 'layers.0.q_proj.weight' is [64, 256], not [128, 128]", r.stderr)
        # an A that cannot be a second moment is refused, not shown as if there were none
        eye = np.eye(128, dtype=np.float32)
        nan_a, neg_a = eye.copy(), -eye
        nan_a[3, 5] = np.nan
        for a_bad, why in ((nan_a, "holds 1 non-finite values"),
                           (neg_a, "is not positive semi-definite: diagonal entry 0 is negative")):
            np.savez(bad, **{"layers.0.q_proj.weight": a_bad})
            r = run("compare", grads, self.path("g.gift"), "--basis", basis, "--activations", bad)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("tensor 'layers.0.q_proj.weight' " + why, r.stderr)

    def test_help_options_are_all_in_the_man_page(self):
        with open(os.path.join(ROOT, "man", "giftc.1")) as f:
            man = f.read().replace("\\-", "-")
        seen = 0
        for sub in ([], ["encode"], ["decode"], ["inspect"], ["compare"], ["fit"], ["bench"]):
            r = run(*sub, "--help")
            self.assertEqual(r.returncode, 0)
            for opt in set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])\b", r.stdout)):
                seen += 1
                self.assertTrue(opt in man, f"'giftc {' '.join(sub)} --help' lists {opt}, the man page does not")
        self.assertGreater(seen, 20)
        self.assertRegex(run("--version").stdout, r"^giftc \d+\.\d+\.\d+ \(GIFT format 1\.0\)")

    def test_bench_reports_ratios(self):
        r = run("bench", "--size", 1 << 22, "--json", "--threads", 1)
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual(doc["bytes"], 1 << 22)
        r = run("bench", "--size", "4K", "--json", "--threads", 1)  # the least: 1024 fp32
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["bytes"], 4096)
        for size in ("4M", "4MiB", "4096K"):  # binary suffixes, as dd and zstd read them
            r = run("bench", "--size", size, "--json", "--threads", 1)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["bytes"], 1 << 22, size)
        self.assertEqual(doc["baseline"], "memcpy")
        for k in ("baseline_gbps", "encode_gbps", "decode_gbps"):
            self.assertGreater(doc[k], 0)
        # 4 MiB of fp32 in rows of 4096: the input, its copy, the decoded fp32 output, 1 MiB of
        # codes and a 4-byte scale per block of 128; every byte of them written, so resident.
        self.assertEqual(doc["buffer_bytes"], 3 * (4 << 20) + (1 << 20) + (1 << 20) // 128 * 4)
        self.assertGreaterEqual(doc["peak_rss_bytes"], doc["buffer_bytes"])
        r = run("bench", "--size", "4M", "--threads", 1)
        self.assertRegex(r.stdout, r"peak memory \d+\.\d MiB resident, of which 13\.0 MiB the buffers")
        self.assertAlmostEqual(doc["encode_ratio"], doc["encode_gbps"] / doc["baseline_gbps"], places=6)

    def test_every_cpu_target_writes_the_same_bytes(self):
        rng = np.random.default_rng(11)
        src = self.path("t.safetensors")
        save_file({"w": (rng.standard_normal((40, 3000)) * 1e-2).astype(np.float32),
                   "h": rng.standard_normal((9, 4500)).astype(np.float16),
                   "b": rng.standard_normal((3, 9000)).astype(ml_dtypes.bfloat16)}, src)

        def under(target, *args):
            env = dict(os.environ, GIFT_CPU_TARGET=target)
            return subprocess.run([GIFTC, *map(str, args)], capture_output=True, env=env)

        r = under("no-such-set", "encode", src, "-c", "-q")
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stdout, b"")
        # The refusal lists the sets this build has, widest first.
        message = r.stderr.decode()
        self.assertIn("GIFT_CPU_TARGET: no CPU instruction set named 'no-such-set'", message)
        names = message.strip().rsplit(": ", 1)[1].split()

        def target(name):
            r = under(name, "bench", "--size", "64K", "--json", "--threads", 1)
            self.assertEqual(r.returncode, 0, r.stderr)
            return json.loads(r.stdout)["ran_on"].rsplit(", ", 1)[1]

        widest = target("")
        self.assertIn(widest, names)
        frame = self.path("t.gift")
        self.assertEqual(run("encode", src, "-o", frame, "-q").returncode, 0)
        with open(frame, "rb") as f:
            want_frame = f.read()
        want_values = under("", "decode", frame, "-c", "-q").stdout
        self.assertGreater(len(want_values), 3 * 9000 * 2)
        for k, name in enumerate(names):
            # The limit where the CPU has it, else the CPU's widest (the sets nest).
            self.assertEqual(target(name.lower()), names[max(k, names.index(widest))])
            self.assertEqual(under(name, "encode", src, "-c", "-q").stdout, want_frame, name)
            self.assertEqual(under(name, "decode", frame, "-c", "-q").stdout, want_values, name)

    def test_device_cuda_gives_the_cpus_bytes_or_a_clear_error(self):
        rng = np.random.default_rng(5)
        src = self.path("d.safetensors")
        save_file({"w": (rng.standard_normal((37, 300)) * 1e-2).astype(np.float32),
                   "h": rng.standard_normal((9, 129)).astype(np.float16),
                   "b": rng.standard_normal(300).astype(np.float32)}, src)
        cpu, gpu = self.path("cpu.gift"), self.path("gpu.gift")
        self.assertEqual(run("encode", src, "-o", cpu, "-q", "--scale", "tile:4x64").returncode, 0)
        r = run("encode", src, "-o", gpu, "-q", "--scale", "tile:4x64", "--device", "cuda")
        if os.environ.get("GIFT_REQUIRE_CUDA_DEVICE", "0") != "0":  # a GPU run must not refuse
            self.assertEqual(r.returncode, 0, r.stderr)
        if r.returncode != 0:  # no GPU here: a precise refusal, and no output
            self.assertIn(r.returncode, (1, 3), r.stderr)
            self.assertRegex(r.stderr, r"--device cuda: (no usable CUDA device|this giftc was built without CUDA)")
            self.assertFalse(os.path.exists(gpu))
            r = run("bench", "--device", "cuda", "--size", "65536")
            self.assertIn(r.returncode, (1, 3), r.stderr)
            return
        with open(cpu, "rb") as a, open(gpu, "rb") as b:
            self.assertEqual(a.read(), b.read())
        for device in ("cpu", "cuda"):
            self.assertEqual(run("decode", cpu, "-o", self.path(device + ".safetensors"), "--device", device).returncode, 0)
        a, b = load_file(self.path("cpu.safetensors")), load_file(self.path("cuda.safetensors"))
        for k in a:
            self.assertEqual(a[k].tobytes(), b[k].tobytes(), k)
        r = run("bench", "--device", "cuda", "--size", str(1 << 24), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertGreater(json.loads(r.stdout)["encode_ratio"], 0)

    def test_exit_codes(self):
        a = self.path("a.npy")
        np.save(a, np.ones((4, 32), np.float32))
        # 1: usage
        self.assertEqual(run("encode", a, "--scale", "block:100").returncode, 1)
        # the parser's own errors read as every other: the program first, then the help to read
        for args, why, command in ((["encode"], "IN is required", "giftc encode"),
                                   (["-q", "frobnicate"], "'frobnicate' is not a command",
                                    "giftc"),
                                   ([], "a command is required: encode decode", "giftc"),
                                   (["--bogus"], "'--bogus' is not an option of giftc", "giftc"),
                                   (["-q", "--bogus", "encode", a], "'--bogus' is not an option of giftc",
                                    "giftc"),
                                   (["decode", "--bogus", a], "--bogus", "giftc decode"),
                                   (["encode", "--threads", "x", a], "--threads = x",
                                    "giftc encode")):
            r = run(*args)
            self.assertEqual(r.returncode, 1, args)
            first, hint = r.stderr.splitlines()
            self.assertTrue(first.startswith("giftc: ") and why in first, r.stderr)
            self.assertEqual(hint, f"Try '{command} --help' for more information.")
        self.assertEqual(run("encode", a).returncode, 0)
        r = run("encode", a)
        self.assertEqual(r.returncode, 1)
        self.assertIn("already exists (use -f to overwrite)", r.stderr)
        # 2: invalid input, and no output left behind
        nan = self.path("nan.npy")
        x = np.ones((4, 32), np.float32)
        x[2, 5] = np.nan
        np.save(nan, x)
        r = run("encode", nan)
        self.assertEqual(r.returncode, 2)
        self.assertIn("1 non-finite value in the input, the first at index 69 (row 2, column 5)"
                      " (--keep-nonfinite stores them)", r.stderr)
        self.assertFalse(any(f.startswith("nan.npy.gift") for f in os.listdir(self.dir)), os.listdir(self.dir))
        self.assertEqual(run("encode", nan, "--keep-nonfinite").returncode, 0)
        with open(a + ".gift", "rb") as f:
            frame = f.read()
        cut = self.path("cut.gift")
        with open(cut, "wb") as f:
            f.write(frame[:-3])
        r = run("inspect", cut)
        self.assertEqual(r.returncode, 2)
        self.assertIn("truncated", r.stderr)
        bad = self.path("bad.safetensors")
        with open(bad, "wb") as f:
            f.write(struct.pack("<Q", 10) + b"not json!!")
        r = run("encode", bad)
        self.assertEqual(r.returncode, 2)
        self.assertIn("bad.safetensors: safetensors header is not valid JSON (at byte 2 of the "
                      "header)", r.stderr)
        junk = self.path("junk.giftb")
        with open(junk, "wb") as f:
            f.write(b"\x89GFT\r\n\x1a\n" + bytes(40))
        r = run("decode", a + ".gift", "--basis", junk, "-o", self.path("j.safetensors"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("junk.giftb", r.stderr)
        # 3: I/O
        r = run("encode", self.path("missing.npy"))
        self.assertEqual(r.returncode, 3)
        self.assertIn("cannot open", r.stderr)
        r = run("decode", a + ".gift", "-o", self.path("no/such/dir/x.safetensors"))
        self.assertEqual(r.returncode, 3)
        # text that cannot all be written to standard output (a full disk) fails the command
        if os.access("/dev/full", os.W_OK):
            for args in (["inspect", a + ".gift"], ["inspect", "--json", a + ".gift"],
                         ["compare", a, a + ".gift"], ["--help"], ["--version"]):
                with open("/dev/full", "w") as full:
                    r = subprocess.run([GIFTC, *args], stdout=full, stderr=subprocess.PIPE,
                                       text=True)
                self.assertEqual(r.returncode, 3, args)
                # with the reason (--version's, flushed by the help's own stream, had none)
                self.assertIn("standard output: write failed: " + os.strerror(errno.ENOSPC),
                              r.stderr, args)
        # 4: a tensor encoded in a GIFT basis this frame does not carry
        r = run("decode", self.in_gift_coords(frame), "-o", self.path("g.safetensors"))
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn("encoded in basis 00000000000000020000000000000001, and no basis is given", r.stderr)

    def test_hostile_archives_are_refused_before_any_work(self):
        a = np.ones((4, 32), np.float32)
        npy = self.path("m.npy")
        np.save(npy, a)
        with open(npy, "rb") as f:
            member = f.read()

        def archive(name, members, edit=None):
            path = self.path(name)
            with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
                for m in members:
                    z.writestr(m, member)
            if edit:
                with open(path, "rb") as f:
                    data = edit(f.read())
                with open(path, "wb") as f:
                    f.write(data)
            return path

        # A member name that is not UTF-8 (same length, so the archive stays consistent).
        bad_name = archive("n.npz", ["wA.npy"], lambda d: d.replace(b"wA.npy", b"w\xff.npy"))
        r = run("encode", bad_name)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("n.npz: tensor name 'w\\xff' is not UTF-8 without NUL", r.stderr)
        # Such a name in a message about its member shows escaped, a NUL too (which would
        # otherwise end the message): here a member whose .npy magic is damaged.
        nul_name = self.path("z0.npz")
        with zipfile.ZipFile(nul_name, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("x.npy", b"\x93NUMPX" + member[6:])
        with open(nul_name, "rb") as f:
            data = f.read().replace(b"x.npy", b"\0.npy")
        with open(nul_name, "wb") as f:
            f.write(data)
        r = run("encode", nul_name)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("z0.npz:\\x00.npy: not a supported .npy file: no .npy magic", r.stderr)
        # Two entries of the central directory pointing at one deflated member.
        def duplicate_entry(d):
            eocd = d.rindex(b"PK\x05\x06")
            entries, cd_size, cd_off = struct.unpack_from("<HII", d, eocd + 10)
            entry = d[cd_off:cd_off + cd_size].replace(b"a.npy", b"b.npy")
            tail = bytearray(d[eocd:])
            struct.pack_into("<HHI", tail, 8, entries + 1, entries + 1, cd_size * 2)
            return d[:cd_off + cd_size] + entry + bytes(tail)
        bomb = archive("bomb.npz", ["a.npy"], duplicate_entry)
        with zipfile.ZipFile(bomb) as z:  # the edit itself is a readable archive
            self.assertEqual(z.namelist(), ["a.npy", "b.npy"])
        r = run("encode", bomb)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("bomb.npz: ZIP members overlap", r.stderr)
        # The same name twice.
        with self.assertWarns(UserWarning):
            twice = archive("twice.npz", ["a.npy", "a.npy"])
        r = run("encode", twice)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("twice.npz: tensor 'a' appears twice", r.stderr)
        self.assertFalse(any(f.endswith(".gift") for f in os.listdir(self.dir)), os.listdir(self.dir))

    def in_gift_coords(self, frame: bytes) -> str:
        """The frame with its tensor marked as encoded in a GIFT basis, rebuilt with flatc."""
        _, _, _, hlen, _, _ = struct.unpack_from("<8sHHIQQ", frame, 0)
        tmp = self.path("h")
        os.makedirs(tmp)
        with open(os.path.join(tmp, "h.bin"), "wb") as f:
            f.write(frame[32:32 + hlen])
        fbs = os.path.join(ROOT, "format", "gift.fbs")
        subprocess.run(["flatc", "--json", "--strict-json", "--raw-binary", "-o", tmp, fbs, "--",
                        os.path.join(tmp, "h.bin")], check=True)
        with open(os.path.join(tmp, "h.json")) as f:
            h = json.load(f)
        old_start = (32 + hlen + 63) // 64 * 64
        data = frame[old_start:]
        h["tensors"][0]["coords"] = "Gift"
        h["tensors"][0]["basis_id"] = {"lo": 1, "hi": 2}
        for _ in range(2):  # the second pass sees the final header length
            with open(os.path.join(tmp, "h.json"), "w") as f:
                json.dump(h, f)
            subprocess.run(["flatc", "-b", "-o", tmp, fbs, os.path.join(tmp, "h.json")], check=True)
            with open(os.path.join(tmp, "h.gift"), "rb") as f:  # gift.fbs's file_extension
                header = f.read()
            start = (32 + len(header) + 63) // 64 * 64
            for t in h["tensors"]:
                for k in ("codes", "scales"):
                    if k in t:
                        t[k]["offset"] = t[k].get("offset", 0) - old_start + start if _ == 0 else t[k]["offset"]
        out = bytearray(start + len(data))
        out[0:32] = struct.pack("<8sHHIQQ", b"\x89GFT\r\n\x1a\n", 1, 0, len(header), xxhash.xxh3_64_intdigest(header), len(out))
        out[32:32 + len(header)] = header
        out[start:] = data
        path = self.path("gift_frame.gift")
        with open(path, "wb") as f:
            f.write(out)
        return path


if __name__ == "__main__":
    ROOT = sys.argv.pop(2)
    GIFTC = sys.argv.pop(1)
    unittest.main(verbosity=1)
