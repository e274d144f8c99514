#!/usr/bin/env bash
# The CPU library, giftc and their tests built with Clang under AddressSanitizer and
# UndefinedBehaviorSanitizer (the main build is GCC's, so both compilers build the project),
# then run: the unit, compatibility and all-reduce local-step tests, and giftc's end-to-end
# tests on the sanitized giftc. Any report fails the run. SANITIZE_BUILD_DIR picks the folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${SANITIZE_BUILD_DIR:-$root/build-sanitize}
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

"$root/scripts/setup.sh"
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGIFT_WITH_CUDA=OFF -DGIFT_WITH_MPI=OFF -DGIFT_WITH_NCCL=OFF -DGIFT_PYTHON=OFF \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
fi
cmake --build "$build" --parallel "$(nproc)" --target unit_tests compat_tests transport_tests giftc

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=0
for bin in unit_tests compat/compat_tests mpi/transport_tests; do
  echo "sanitize: $(basename "$bin")"
  "$build/tests/$bin" --gtest_brief=1 || failed=1
done
echo "sanitize: giftc end to end"
python3 "$root/tests/cli/test_giftc.py" "$build/cli/giftc" "$root" || failed=1
[ "$failed" -eq 0 ] && echo "sanitize: passed" || echo "sanitize: FAILED"
exit "$failed"
