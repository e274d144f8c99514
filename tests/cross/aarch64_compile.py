#!/usr/bin/env python3
"""Compiles libgift's and giftc's C++ sources for Arm64 with Debian's cross compiler, as the
main build compiles them (its compile_commands.json): objects of the files that use Highway,
whose Arm targets (NEON, and SVE, which numerics/hwy_targets.h leaves out) fail only in code
generation, and the language's checks of the others, where anything x86-only in our code
fails. Nothing is linked or run (Arm64 libraries are not installed); the headers of the other
dependencies are the host's, the same on every architecture but OpenBLAS's configuration
(taken from the x86 folder here: compiling only).

Usage: aarch64_compile.py BUILD_DIR
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

CXX = "aarch64-linux-gnu-g++"
# Device, MPI and NCCL sources need their toolkits, which the Arm64 build would have its own of.
SKIP = ("/device", "device_", "mpi_backend", "nccl_backend", "/tests/", "/python/", "/samples/")


def uses_highway(path):
    with open(path, encoding="utf-8") as f:
        return "<hwy/" in f.read()


def arm_command(entry, out):
    args = shlex.split(entry["command"])[1:]
    keep, skip_next = [CXX], False
    for a in args:
        if skip_next:
            skip_next = False
        elif a in ("-o", "-MF", "-MT", "-isystem"):
            skip_next = True
        elif a in ("-MD", "-c", entry["file"]) or "GIFT_HAVE_CUDA" in a or "cuda" in a:
            pass
        else:
            keep.append(a)
    # Code generation for the files Highway compiles per target (where target attributes and
    # intrinsics fail); the language's checks alone for the others, which is where they could
    # fail and takes a fraction of the time.
    mode = ["-c", "-o", out] if uses_highway(entry["file"]) else ["-fsyntax-only"]
    return keep + ["-idirafter", "/usr/include", "-idirafter", "/usr/include/x86_64-linux-gnu",
                   entry["file"]] + mode


def main():
    build = sys.argv[1]
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = [e for e in json.load(f)
                   if e["file"].endswith(".cc") and not any(s in e["file"] for s in SKIP)]
    seen, todo = set(), []
    for e in entries:  # a source can be in two targets (gift and gift_core)
        if e["file"] not in seen:
            seen.add(e["file"])
            todo.append(e)
    if len(todo) < 30:
        sys.exit(f"only {len(todo)} sources found in {build}/compile_commands.json")
    with tempfile.TemporaryDirectory() as tmp:
        def compile_one(i_e):
            i, e = i_e
            r = subprocess.run(arm_command(e, os.path.join(tmp, f"{i}.o")), cwd=e["directory"],
                               capture_output=True, text=True)
            return e["file"], r.returncode, r.stderr
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            results = list(pool.map(compile_one, enumerate(todo)))
    failed = [(f, err) for f, rc, err in results if rc != 0]
    for f, err in failed:
        print(f"FAILED: {f}\n{err}")
    print(f"{len(results) - len(failed)} of {len(results)} sources compiled for Arm64")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
