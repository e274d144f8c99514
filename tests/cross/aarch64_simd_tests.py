#!/usr/bin/env python3
"""Runs the vector kernels' tests (tests/unit/simd_targets_test.cc: every kernel of
numerics/simd.cc, numerics/pair_sums.cc and coords/low_rank_update.cc against the scalar
rules) and the scalar rules' own (tests/unit/fp8_rules_test.cc: FP8, scales, Philox) on
Arm64, under QEMU's user mode: Highway's NEON code, which the x86 machines never run, and
the rules compiled for another instruction set. The sources are compiled with Debian's cross
compiler as the main build compiles them (its compile_commands.json, as aarch64_compile.py
rewrites them), one at a time (ctest counts the test as one processor's work), for Highway's
static target alone (HWY_COMPILE_ONLY_STATIC: NEON, dispatched without libhwy, of which no
Arm64 build is installed); hwy_static_shim.cc stands in for the rest. GoogleTest is built from
its Debian sources (the googletest package, which libgtest-dev brings), and all is linked
statically.

Usage: aarch64_simd_tests.py BUILD_DIR
Exit status: 0 passed, 1 failed (a compile, the link or a test), 77 skipped (no GoogleTest
sources, cross compiler or qemu-aarch64).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aarch64_compile import CXX, arm_command  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GTEST = "/usr/src/googletest/googletest"
# The tests and the kernels they call, from the main build's commands.
SOURCES = ("tests/unit/simd_targets_test.cc", "libcodec/src/numerics/simd.cc",
           "libcodec/src/numerics/pair_sums.cc", "libcodec/src/coords/low_rank_update.cc",
           "tests/unit/fp8_rules_test.cc")
QEMU = "qemu-aarch64"


def skip(why):
    print(f"SKIPPED: {why}")
    sys.exit(77)


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} BUILD_DIR")
    build = sys.argv[1]
    if not os.path.isfile(os.path.join(GTEST, "src", "gtest-all.cc")):
        skip(f"no GoogleTest sources in {GTEST} (Debian: googletest)")
    for tool in (CXX, QEMU):
        if not shutil.which(tool):
            skip(f"{tool} not found (Debian: g++-aarch64-linux-gnu, qemu-user)")
    commands = os.path.join(build, "compile_commands.json")
    if not os.path.isfile(commands):
        sys.exit(f"no {commands} (a build configured by CMake with CMAKE_EXPORT_COMPILE_COMMANDS)")
    with open(commands) as f:
        entries = {e["file"]: e for e in json.load(f)}
    wanted = [os.path.join(ROOT, s) for s in SOURCES]
    missing = [s for s in wanted if s not in entries]
    if missing:
        sys.exit(f"not in {build}/compile_commands.json: {missing}")
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        for i, path in enumerate(wanted):
            out = os.path.join(tmp, f"{i}.o")
            cmd = arm_command(entries[path], out)
            if "-fsyntax-only" in cmd:  # a file without Highway: compiled all the same
                cmd = cmd[:cmd.index("-fsyntax-only")] + ["-c", "-o", out]
            jobs.append((path, [cmd[0], "-DHWY_COMPILE_ONLY_STATIC"] + cmd[1:],
                         entries[path]["directory"]))
        # The shim with the kernels' flags (their include folders); GoogleTest as its own
        # CMake build would compile it.
        kernel = jobs[1][1]
        shim = [a for a in kernel if a != wanted[1]]
        shim = shim[:shim.index("-c")] + [os.path.join(HERE, "hwy_static_shim.cc"),
                                          "-c", "-o", os.path.join(tmp, "shim.o")]
        jobs.append(("hwy_static_shim.cc", shim, entries[wanted[1]]["directory"]))
        for name in ("gtest-all", "gtest_main"):
            jobs.append((name, [CXX, "-std=c++17", "-O2", "-I", os.path.join(GTEST, "include"),
                                "-I", GTEST, "-c", os.path.join(GTEST, "src", f"{name}.cc"),
                                "-o", os.path.join(tmp, f"{name}.o")], tmp))

        failed = 0
        for name, cmd, cwd in jobs:
            r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAILED: compiling {name}\n{r.stderr}")
                failed += 1
        if failed:
            sys.exit(1)
        binary = os.path.join(tmp, "simd_targets_arm64")
        objects = sorted(os.path.join(tmp, o) for o in os.listdir(tmp) if o.endswith(".o"))
        r = subprocess.run([CXX, "-static", "-fopenmp", *objects, "-o", binary, "-lpthread"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAILED: linking\n{r.stderr}")
            sys.exit(1)
        # Two threads, as on CI's two cores, for the kernels' parallel loops (pair sums).
        r = subprocess.run([QEMU, binary, "--gtest_brief=1"],
                           env=dict(os.environ, OMP_NUM_THREADS="2"))
        sys.exit(0 if r.returncode == 0 else 1)


if __name__ == "__main__":
    main()
