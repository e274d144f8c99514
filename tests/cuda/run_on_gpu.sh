#!/usr/bin/env bash
# One call on a machine WITH a GPU (CUDA at /usr/local/cuda or nvcc on PATH, no network
# needed): dependencies, a CUDA build of its own (build-gpu, sm_90), the device tests, the NCCL
# all-reduce, the GPU benchmark, giftc --device cuda, the Python package on CUDA tensors and
# the DDP hook on CUDA buckets, and the device tests again under compute-sanitizer memcheck,
# then a table of results with the GPU figures (about 100 s on an H200 machine). Run it
# from anywhere in the repository, after tests/cuda/fetch_gpu_deps.sh on a machine with
# network when the GPU machine has none. .gpu-deps/ is ignored by git: name it among the
# paths carried to the GPU machine, or the script falls back to scripts/setup.sh, which needs
# network:
#
#   bash tests/cuda/run_on_gpu.sh
#
# Each step's log goes to build-gpu/gpu-logs; when $OUT is set, the table goes to
# "$OUT/gpu_report.txt" and the logs, packed, to "$OUT/gpu-logs.tar.gz" (two files: the
# device tool brings back only a few).
# Exits non-zero when any test fails (or is skipped: on a GPU machine nothing may skip), when
# the build fails, or when a step crashes or runs out of time. The Python package's steps need
# a python3 with torch built for CUDA, which the machine may lack: they are then reported as
# "not run" with the reason, which is not a failure.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
build="build-gpu"
jobs=$(nproc)
# Per-step time limits in seconds, so that one slow step cannot eat the whole session.
device_timeout=${GIFT_GPU_DEVICE_TIMEOUT:-300}
reference_timeout=${GIFT_GPU_REFERENCE_TIMEOUT:-600}
bench_timeout=${GIFT_GPU_BENCH_TIMEOUT:-300}

logdir=$root/$build/gpu-logs
rm -rf "$logdir"
mkdir -p "$logdir"

rows=()     # "name<TAB>status"
failed=0
gpu_table=""

add_row() {  # name status
  rows+=("$1"$'\t'"$2")
  case "$2" in passed | ran | "not run"*) ;; *) failed=1 ;; esac
}

report() {
  local table
  table=$(
    printf '%-90s %s\n' "TEST" "RESULT"
    for r in "${rows[@]}"; do printf '%-90s %s\n' "${r%%$'\t'*}" "${r#*$'\t'}"; done
    [ "$failed" -eq 0 ] && echo "OVERALL: passed" || echo "OVERALL: FAILED"
    if [ -n "$gpu_table" ]; then
      echo
      echo "$gpu_table"
    fi
  )
  echo
  echo "==== GPU run summary ===="
  echo "$table"
  if [ -n "${OUT:-}" ]; then
    echo "$table" >"$OUT/gpu_report.txt"
    tar -czf "$OUT/gpu-logs.tar.gz" -C "$logdir" .
  fi
}

# A partial table still comes out when the run is stopped from outside.
# shellcheck disable=SC2317  # called through the trap
on_signal() {
  add_row "run interrupted by signal" failed
  report
  exit 1
}
trap on_signal INT TERM

# Runs a GoogleTest binary and adds one row per test from its output; a crash, a time-out or
# a failure outside any test adds a row for the binary itself.
run_gtest() {  # label binary timeout [args...]
  local label=$1 bin=$2 limit=$3
  shift 3
  local log="$logdir/$label.log"
  if [ ! -x "$bin" ]; then
    add_row "$label (binary $bin missing)" failed
    return
  fi
  echo "==== $label ===="
  local rc=0
  GIFT_REQUIRE_CUDA_DEVICE=1 timeout --signal=TERM --kill-after=10 "$limit" "$bin" "$@" 2>&1 |
    tee "$log" || rc=$?
  local parsed
  # Per-test result lines end in "(N ms)"; the summary at the end repeats them without it.
  # A failed parametrized test reads "[  FAILED  ] Suite.Test/P, where GetParam() = ... (N ms)".
  parsed=$(sed -nE 's/^\[ +(OK|FAILED|SKIPPED) +\] ([^ ,]+).* \([0-9]+ ms\)$/\2\t\1/p' "$log")
  local n=0 name status
  while IFS=$'\t' read -r name status; do
    [ -n "$name" ] || continue
    n=$((n + 1))
    case "$status" in
      OK) add_row "$label: $name" passed ;;
      SKIPPED) add_row "$label: $name" "skipped (counts as failed here)" ;;
      *) add_row "$label: $name" failed ;;
    esac
  done <<<"$parsed"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    add_row "$label (timed out after ${limit}s)" failed
  elif [ "$rc" -ne 0 ] && ! grep -q '^\[  FAILED  \]' "$log"; then
    add_row "$label (exit code $rc)" failed
  elif [ "$n" -eq 0 ]; then
    add_row "$label (no test ran)" failed
  fi
}

# ---- Set-up and build --------------------------------------------------------------------
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
export CUDACXX=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}

# Dependencies. A lent GPU machine has CUDA but no network and none of our Debian -dev
# packages: tests/cuda/fetch_gpu_deps.sh downloads them here into .gpu-deps/, carried with
# the tree, and they are unpacked into a private prefix (never into /). Without that folder,
# scripts/setup.sh installs what is missing; a failure there is recorded and the build is
# tried anyway, since the machine may have everything.
cmake_deps=()
if compgen -G "$root/.gpu-deps/*.deb" >/dev/null; then
  echo "==== dependencies (.gpu-deps) ===="
  if [ "$(uname -m)" != x86_64 ]; then
    add_row "dependencies (.gpu-deps holds amd64 packages; this is $(uname -m))" failed
  fi
  # Inside the build folder, so the paths CMake caches stay valid from one call to the next.
  prefix="$root/$build/deps"
  rm -rf "$prefix"
  mkdir -p "$prefix"
  ok=1
  for deb in "$root"/.gpu-deps/*.deb; do
    if command -v dpkg-deb >/dev/null 2>&1; then
      dpkg-deb -x "$deb" "$prefix" || ok=0
    else  # a .deb is an ar archive holding data.tar.*
      tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$prefix") || ok=0
      rm -rf "$tmp"
    fi
  done
  # Absolute links (libz.so -> /lib/...) point into the prefix, where their targets are.
  while IFS= read -r link; do
    target=$(readlink "$link")
    [ -e "$prefix$target" ] && ln -sfn "$prefix$target" "$link"
  done < <(find "$prefix" -type l -lname '/*')
  lib="$prefix/usr/lib/x86_64-linux-gnu"
  blas="$lib/openblas-pthread"  # Debian's alternatives links are not made by unpacking
  # At run time, only the libraries a machine like this lacks are put first (zlib and zstd
  # stay the system's: the compiler uses them too).
  runtime="$prefix/runtime"
  mkdir -p "$runtime"
  for so in "$blas"/libopenblas.so.0 "$blas"/libblas.so.3 "$blas"/liblapack.so.3 \
    "$lib"/liblapacke.so.3 "$lib"/libtmglib.so.3 "$lib"/libgfortran.so.5 \
    "$lib"/libquadmath.so.0 "$lib"/libhwy.so.1 "$lib"/libxxhash.so.0 \
    "$lib"/libbenchmark.so.1debian "$lib"/libflatbuffers.so.2 "$lib"/libpkgconf.so.3; do
    if [ -e "$so" ]; then ln -sf "$so" "$runtime/"; else
      echo "missing in .gpu-deps: $so"
      ok=0
    fi
  done
  export PATH="$prefix/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # Only the prefix's .pc files, their /usr paths moved under the prefix.
  export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$prefix"
  cmake_deps=(-DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_LIBRARY_PATH="$blas"
    -DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf")
  if [ "$ok" -eq 1 ]; then add_row "dependencies (.gpu-deps unpacked into $prefix)" passed; else
    add_row "dependencies (unpacking .gpu-deps)" failed
  fi
else
  echo "==== setup ===="
  if scripts/setup.sh; then add_row "setup (scripts/setup.sh)" passed; else
    add_row "setup (scripts/setup.sh; build tried anyway)" failed
  fi
fi

echo "==== toolchain ===="
for tool in nvcc g++ cmake ninja flatc pkg-config python3; do
  printf '%-10s %s\n' "$tool" "$(command -v "$tool" || echo 'not found')"
done

# Only what this run uses, with warnings reported but not fatal: this machine's compiler may
# be newer than CI's, which keeps -Werror. CMAKE_POLICY_VERSION_MINIMUM lets a CMake 4 read
# the older packages' config files.
# GIFT_GPU_CMAKE_ARGS: more configure arguments, split on spaces.
read -ra cmake_extra <<<"${GIFT_GPU_CMAKE_ARGS:-}"
targets=(cuda_device_tests nccl_allreduce_tests bench_cuda giftc)
[ "${GIFT_GPU_CPU_STEPS:-0}" = 1 ] && targets+=(cuda_reference_tests bench_codec)

# The Python package is built for the first python3 whose torch is built for CUDA, with that
# interpreter's pybind11 when it has one (else the one of .gpu-deps or the system).
torch_py=""
for candidate in python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null 2>&1 &&
    "$candidate" -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)" >/dev/null 2>&1; then
    torch_py=$(command -v "$candidate")
    break
  fi
done
python_args=()
if [ -n "$torch_py" ]; then
  python_args=(-DPython3_EXECUTABLE="$torch_py")
  if pybind11_dir=$("$torch_py" -m pybind11 --cmakedir 2>/dev/null); then
    python_args+=(-Dpybind11_DIR="$pybind11_dir")
  fi
fi

# NCCL: CUDA's own folders first (the build looks there); where they lack it, the NCCL wheel
# that torch was built with (nvidia-nccl), whose library has no unversioned name for the
# linker to find: one is made in the build folder.
nccl_args=()
cuda_root=$(dirname "$(dirname "$(readlink -f "$CUDACXX")")")
if ! compgen -G "$cuda_root/lib*/libnccl.so*" >/dev/null && [ -n "$torch_py" ]; then
  wheel=$("$torch_py" -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null || true)
  if [ -n "$wheel" ] && [ -e "$wheel/include/nccl.h" ] && compgen -G "$wheel/lib/libnccl.so.*" >/dev/null; then
    mkdir -p "$build/nccl"
    ln -sfn "$(ls "$wheel"/lib/libnccl.so.* | head -n 1)" "$build/nccl/libnccl.so"
    nccl_args=(-DNCCL_LIBRARY="$root/$build/nccl/libnccl.so" -DNCCL_INCLUDE_DIR="$wheel/include")
    export LD_LIBRARY_PATH="$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "NCCL from $wheel"
  else
    echo "NCCL: none in $cuda_root nor in torch's wheels; the NCCL steps will be reported missing"
  fi
fi

echo "==== configure and build ($build: ${targets[*]}, and the Python package when it can) ===="
if cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGIFT_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DGIFT_WARNINGS_AS_ERRORS=OFF -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  "${cmake_deps[@]}" "${python_args[@]}" "${nccl_args[@]}" "${cmake_extra[@]}" 2>&1 |
  tee "$logdir/configure.log" &&
  { grep -q '^build nccl_allreduce_tests:' "$build/build.ninja" || {
    kept=()
    for t in "${targets[@]}"; do [ "$t" = nccl_allreduce_tests ] || kept+=("$t"); done
    targets=("${kept[@]}")
    add_row "nccl_allreduce_tests (not configured: NCCL not found; see configure.log)" failed
  }; } &&
  { [ -z "$torch_py" ] || ! grep -q '^build gift_python:' "$build/build.ninja" ||
    targets+=(gift_python); } &&
  cmake --build "$build" --parallel "$jobs" --target "${targets[@]}" 2>&1 | tee "$logdir/build.log"; then
  add_row "build ($build, sm_90, Release)" passed
else
  add_row "build ($build, sm_90, Release)" failed
  report
  exit 1
fi

# ---- The machine ---------------------------------------------------------------------------
echo "==== GPU ===="
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv || true
else
  echo "nvidia-smi not found"
fi
nvcc --version | tail -n 2

# ---- Tests ---------------------------------------------------------------------------------
# Device tests first: they are the reason for this run and take seconds.
run_gtest cuda_device_tests "$build/tests/cuda/cuda_device_tests" "$device_timeout"
# The NCCL all-reduce on one GPU (world 1) and on all GPUs of the machine, against the CPU.
run_gtest nccl_allreduce_tests "$build/tests/cuda/nccl_allreduce_tests" "$device_timeout"
# ---- GPU benchmark: encode/decode against a device-to-device copy, and the whitener --------
gpu_bench="$build/tests/bench/bench_cuda"
if [ -x "$gpu_bench" ]; then
  echo "==== bench_cuda (GPU) ===="
  rc=0
  timeout --signal=TERM --kill-after=10 "$bench_timeout" "$gpu_bench" 2>&1 |
    tee "$logdir/bench_cuda.log" || rc=$?
  if [ "$rc" -eq 0 ]; then
    add_row "bench_cuda (GPU; table below)" ran
    gpu_table=$(cat "$logdir/bench_cuda.log")
  else
    add_row "bench_cuda (GPU; exit code $rc)" failed
  fi
else
  add_row "bench_cuda (binary $gpu_bench missing)" failed
fi

# giftc --device cuda end to end: the same frame bytes and decoded values as on the CPU.
echo "==== giftc --device cuda ===="
rc=0
GIFT_REQUIRE_CUDA_DEVICE=1 timeout --signal=TERM --kill-after=10 "$device_timeout" python3 tests/cli/test_giftc.py \
  "$build/cli/giftc" "$root" Giftc.test_device_cuda_gives_the_cpus_bytes_or_a_clear_error 2>&1 |
  tee "$logdir/giftc_device.log" || rc=$?
if [ "$rc" -eq 0 ]; then
  add_row "giftc --device cuda (frame bytes equal to the CPU's)" passed
else
  add_row "giftc --device cuda (exit code $rc)" failed
fi

# ---- The Python package on CUDA tensors, and the DDP hook on CUDA buckets -----------------
# Runs a Python test with the interpreter the package was built for; unittest's verbose lines
# ("test_x (...) ... ok") become one row each.
run_python() {  # label timeout script [args...]
  local label=$1 limit=$2
  shift 2
  local log="$logdir/$label.log" rc=0
  echo "==== $label ===="
  GIFT_REQUIRE_CUDA_DEVICE=1 PYTHONPATH="$root/$build/python" OMP_NUM_THREADS=1 \
    timeout --signal=TERM --kill-after=10 "$limit" "$torch_py" "$@" 2>&1 | tee "$log" || rc=$?
  local parsed n=0 name status
  parsed=$(sed -nE 's/^(test_[A-Za-z0-9_]+) \(.*\) \.\.\. (ok|FAIL|ERROR)$/\1\t\2/p' "$log")
  while IFS=$'\t' read -r name status; do
    [ -n "$name" ] || continue
    n=$((n + 1))
    if [ "$status" = ok ]; then add_row "$label: $name" passed; else add_row "$label: $name" failed; fi
  done <<<"$parsed"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    add_row "$label (timed out after ${limit}s)" failed
  elif [ "$rc" -ne 0 ]; then
    add_row "$label (exit code $rc: $(grep -m1 -E 'SKIPPED|Error|FAILED' "$log" || echo 'see its log'))" failed
  elif [ "$n" -eq 0 ]; then
    add_row "$label ($(grep -m1 -E '^(cuda buckets|OK)' "$log" || echo 'passed'))" passed
  fi
}

if [ -z "$torch_py" ]; then
  add_row "python: gift on CUDA tensors, the DDP hook on NCCL" \
    "not run: no python3 here has torch built for CUDA"
elif ! compgen -G "$build/python/gift/_gift*.so" >/dev/null; then
  add_row "python: gift on CUDA tensors, the DDP hook on NCCL" \
    "not run: the module was not built for $torch_py (Python headers or pybind11 missing; see configure.log)"
else
  # The package's encode/decode and device plans against the host, byte for byte.
  run_python "python: CUDA tensors against the host" "$device_timeout" tests/python/test_cuda.py
  # The hook through device plans and NCCL: one process (the whole device path, the bytes
  # exchanged with itself), then one rank per GPU where there are two; two gloo ranks share
  # one GPU (gloo moves CUDA tensors through the host; NCCL refuses two ranks on one GPU).
  run_python "python: DDP hook, nccl, 1 process" "$device_timeout" \
    tests/python/test_ddp_cuda.py --world 1 --backend nccl
  gpus=$("$torch_py" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  if [ "$gpus" -ge 2 ]; then
    run_python "python: DDP hook, nccl, 2 processes on 2 GPUs" "$device_timeout" \
      tests/python/test_ddp_cuda.py --world 2 --backend nccl
  fi
  run_python "python: DDP hook, gloo, 2 processes sharing a GPU" "$device_timeout" \
    tests/python/test_ddp_cuda.py --world 2 --backend gloo
fi

# The device tests again under compute-sanitizer's memcheck (out-of-bounds and misaligned
# accesses, leaks of device memory), without the exhaustive and the large tests, which it
# would slow past any limit. GIFT_GPU_SANITIZE=0 leaves it out.
if [ "${GIFT_GPU_SANITIZE:-1}" = 1 ]; then
  sanitizer=$(command -v compute-sanitizer || true)
  for candidate in "$cuda_root/bin/compute-sanitizer" "$cuda_root/compute-sanitizer/compute-sanitizer"; do
    [ -n "$sanitizer" ] || [ ! -x "$candidate" ] || sanitizer=$candidate
  done
  if [ -z "$sanitizer" ]; then
    add_row "compute-sanitizer memcheck of cuda_device_tests" "not run: compute-sanitizer not found"
  else
    echo "==== compute-sanitizer memcheck ===="
    rc=0
    GIFT_REQUIRE_CUDA_DEVICE=1 timeout --signal=TERM --kill-after=10 "$device_timeout" \
      "$sanitizer" --tool memcheck --leak-check full --error-exitcode 99 \
      "$build/tests/cuda/cuda_device_tests" --gtest_filter='-*All2To32*:*LargeTensors*' 2>&1 |
      tee "$logdir/memcheck.log" || rc=$?
    case "$rc" in
      0) add_row "compute-sanitizer memcheck of cuda_device_tests (no error)" passed ;;
      99) add_row "compute-sanitizer memcheck of cuda_device_tests (errors: memcheck.log)" failed ;;
      124 | 137) add_row "compute-sanitizer memcheck (timed out after ${device_timeout}s)" failed ;;
      *) add_row "compute-sanitizer memcheck of cuda_device_tests (exit code $rc)" failed ;;
    esac
  fi
fi

# CPU-only steps (CI runs them anyway): only with GIFT_GPU_CPU_STEPS=1, to spend the lent
# device's time on what needs it.
if [ "${GIFT_GPU_CPU_STEPS:-0}" = 1 ]; then
  # The CPU suite's check against CUDA's host FP8 conversion (2^32 patterns, all cores).
  run_gtest cuda_reference_tests "$build/tests/cuda_reference_tests" "$reference_timeout"

  # ---- Benchmarks ----------------------------------------------------------------------------
  bench="$build/tests/bench/bench_codec"
  if [ -x "$bench" ]; then
    echo "==== bench_codec (CPU) ===="
    rc=0
    timeout --signal=TERM --kill-after=10 "$bench_timeout" "$bench" --benchmark_min_time=0.3 --benchmark_color=false 2>&1 |
      tee "$logdir/bench_codec.log" || rc=$?
    if [ "$rc" -eq 0 ]; then add_row "bench_codec (CPU; numbers in the log above)" ran; else
      add_row "bench_codec (CPU; exit code $rc)" failed
    fi
  else
    echo "bench_codec not built; skipping the CPU benchmark"
  fi
fi

report
exit "$failed"
