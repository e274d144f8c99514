#!/usr/bin/env bash
# Configures (once) and builds targets of one of the two sanitized trees, with Clang:
#
#   scripts/sanitized-build.sh asan|tsan DIR TARGET...
#
# asan  AddressSanitizer and UndefinedBehaviorSanitizer, -O2, every UBSan report fatal; also
#       instrumented for libFuzzer (GIFT_FUZZERS), so that the fuzzers (tests/fuzz) are built
#       in this tree rather than in one of their own: scripts/sanitize.sh runs the unit tests
#       and the fuzzers from the one tree, and tests/fuzz/run_fuzz.sh builds it alone.
# tsan  ThreadSanitizer, -O1, with LLVM's OpenMP runtime (see scripts/sanitize.sh).
#
# The CPU library only (no CUDA, MPI, NCCL or Python), with line tables only (-g1): stacks
# still name file and line, and compiling takes less time.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 3 ] || {
  echo "usage: $0 asan|tsan DIR TARGET..." >&2
  exit 2
}
kind=$1 dir=$2
shift 2
case "$kind" in
  asan)
    opt=-O2 fuzzers=ON
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    ;;
  tsan)
    opt=-O1 fuzzers=OFF
    flags="-fsanitize=thread -fno-omit-frame-pointer"
    ;;
  *)
    echo "$0: unknown kind '$kind' (asan or tsan)" >&2
    exit 2
    ;;
esac

# One configuration and build at a time in a tree: a second run (run_fuzz.sh by hand beside
# scripts/sanitize.sh) waits for the first, then finds the tree built.
# The lock's descriptor is closed in the commands run under it (9>&-): a process they leave
# running would hold it.
mkdir -p "$dir"
exec 9>"$dir/.sanitized-build.lock"
if ! flock -n 9; then
  echo "sanitized-build: waiting for another build of $dir" >&2
  flock 9
fi

# Configured once; again where a tree was configured otherwise (by hand, or by an older
# version of this script).
if ! grep -qxF "GIFT_FUZZERS:BOOL=$fuzzers" "$dir/CMakeCache.txt" 2>/dev/null ||
  ! grep -qxF "CMAKE_CXX_FLAGS:STRING=$flags" "$dir/CMakeCache.txt" ||
  ! grep -qxF "CMAKE_CXX_FLAGS_RELWITHDEBINFO:STRING=$opt -g1 -DNDEBUG" "$dir/CMakeCache.txt"; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGIFT_WITH_CUDA=OFF -DGIFT_WITH_MPI=OFF -DGIFT_WITH_NCCL=OFF -DGIFT_PYTHON=OFF \
    -DGIFT_FUZZERS=$fuzzers \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$opt -g1 -DNDEBUG" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt -g1 -DNDEBUG" \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null 9>&-
fi
start=$SECONDS
cmake --build "$dir" --parallel "$(nproc)" --target "$@" 9>&-
echo "sanitized-build: built $(basename "$dir") in $((SECONDS - start)) s"
