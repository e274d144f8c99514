#!/usr/bin/env bash
# The CPU library, giftc and their tests built twice more and run; any report fails:
# - Clang under AddressSanitizer and UndefinedBehaviorSanitizer: the unit, compatibility and
#   all-reduce local-step tests, giftc's end-to-end tests on the sanitized giftc (the main
#   build is GCC's, so Clang's warnings are checked here too), and the two fuzzers, built in
#   the same tree (tests/fuzz/README.md);
# - Clang under ThreadSanitizer with LLVM's OpenMP runtime, whose Archer tool tells TSan
#   about OpenMP's barriers and tasks (GCC's libgomp is not instrumented): the tests that run
#   the codec, the frame writer and reader, an output's writes behind, and the all-reduce's
#   local steps on several threads.
# SANITIZE_BUILD_DIR picks the folder that holds the two build trees (scripts/sanitized-build.sh
# configures and builds them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${SANITIZE_BUILD_DIR:-$root/build-sanitize}

"$root/scripts/setup.sh"

failed=0
# Runs one test command under a label; a failure is counted, and the other runs still happen.
run() {
  local label=$1 start=$SECONDS
  shift
  echo "sanitize: $label"
  "$@" || failed=1
  echo "sanitize: $label: $((SECONDS - start)) s"
}

# Runs a GoogleTest binary as four shards per processor, as many side by side as there are
# processors, each shard's output printed once all have ended; any failing shard fails the
# run. One shard per processor took as long as the tests on one core (2.4 minutes): the few
# long tests fell into one of them.
sharded() {
  local bin=$1 shards procs logs i running=0 rc=0
  shift
  procs=$(nproc)
  shards=$((4 * procs))
  logs=$(mktemp -d)
  # wait -n takes whichever child ends: this shell has no other job running meanwhile.
  for ((i = 0; i < shards; i++)); do
    if [ "$running" -eq "$procs" ]; then
      wait -n || rc=1
      running=$((running - 1))
    fi
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$bin" "$@" >"$logs/$i" 2>&1 &
    running=$((running + 1))
  done
  for (( ; running > 0; running--)); do wait -n || rc=1; done
  for ((i = 0; i < shards; i++)); do cat "$logs/$i"; done
  rm -rf "$logs"
  return $rc
}

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The job may share its cores: an OpenMP thread that spins at a barrier for a whole time slice
# makes each small parallel loop take milliseconds (a test of 8000 of them took a minute).
export OMP_WAIT_POLICY=passive

clang_asan=$build/clang-asan
"$root/scripts/sanitized-build.sh" asan "$clang_asan" unit_tests compat_tests transport_tests giftc \
  frame_fuzzer tensor_file_fuzzer make_seeds
for bin in unit_tests compat/compat_tests mpi/transport_tests; do
  run "clang asan+ubsan $(basename "$bin")" sharded "$clang_asan/tests/$bin" --gtest_brief=1
done
run "clang asan+ubsan giftc end to end" \
  python3 "$root/tests/cli/test_giftc.py" "$clang_asan/cli/giftc" "$root"

# Frames and bases are the same bytes whichever compiler built the writer: FlatBuffers lays a
# header out in the order of the builder's calls, and C++ leaves the order of a call's
# arguments to the compiler. Clang's giftc against the main build's GCC one, on the sample
# with a basis, and on a safetensors file with metadata.
same_bytes_as_gcc() {
  local gcc_giftc=${BUILD_DIR:-$root/build}/cli/giftc s=$root/samples tmp
  [ -x "$gcc_giftc" ] || { echo "no GCC giftc at $gcc_giftc" >&2; return 1; }
  tmp=$(mktemp -d)
  python3 -c 'import sys, numpy as np; from safetensors.numpy import save_file
save_file({"w": np.linspace(-3, 3, 4096, dtype=np.float32).reshape(32, 128),
           "b": np.arange(7, dtype=np.float16)}, sys.argv[1], {"step": "1200", "model": "x"})' \
    "$tmp/meta.safetensors"
  local c rc=0
  for c in gcc clang; do
    local g=$gcc_giftc
    [ $c = clang ] && g=$clang_asan/cli/giftc
    "$g" -q fit "$s/llama_grads.npz" --activations "$s/llama_acts.npz" -o "$tmp/$c.giftb" &&
      "$g" -q encode "$s/llama_grads.npz" --basis "$tmp/gcc.giftb" --embed-basis \
        -o "$tmp/$c.gift" &&
      "$g" -q encode "$tmp/meta.safetensors" -o "$tmp/$c.meta.gift" || rc=1
  done
  for f in giftb gift meta.gift; do cmp "$tmp/gcc.$f" "$tmp/clang.$f" || rc=1; done
  rm -rf "$tmp"
  return $rc
}
run "clang and gcc giftc write the same bytes" same_bytes_as_gcc

# The two fuzzers side by side, each on one processor, each one's output printed once both
# have ended. run_fuzz.sh replays a fuzzer's regression inputs, then fuzzes it for 30 s here (a
# smoke run on every change; by hand it fuzzes the frames for 60 s by default, and
# GIFT_FUZZ_SECONDS sets any length).
fuzz_both() {
  local logs frame rc=0
  logs=$(mktemp -d)
  GIFT_FUZZ_BUILT=1 GIFT_FUZZ_SECONDS=30 "$root/tests/fuzz/run_fuzz.sh" "$clang_asan" frame \
    >"$logs/frame" 2>&1 &
  frame=$!
  GIFT_FUZZ_BUILT=1 GIFT_FUZZ_SECONDS=30 "$root/tests/fuzz/run_fuzz.sh" "$clang_asan" tensor_file \
    >"$logs/tensor_file" 2>&1 || rc=1
  wait "$frame" || rc=1
  cat "$logs/frame" "$logs/tensor_file"
  rm -rf "$logs"
  return $rc
}
run "libFuzzer on the frame and tensor-file readers" fuzz_both

# Archer ships with LLVM's OpenMP runtime, next to clang's own libraries.
archer=$(cd "$(clang -print-resource-dir)/../.." && pwd)/libarcher.so
[ -f "$archer" ] || {
  echo "sanitize: FAILED: $archer not found (Debian: libomp-14-dev)" >&2
  exit 1
}
clang_tsan=$build/clang-tsan
"$root/scripts/sanitized-build.sh" tsan "$clang_tsan" unit_tests transport_tests
# LLVM's OpenMP runtime is not instrumented itself: Archer reports its barriers and joins to
# TSan, which ignores the runtime's own accesses (without both, every parallel loop would be
# reported). Two codec threads, as on CI's two cores (more are capped at the processors
# anyway); OpenBLAS's threads are not instrumented either, so it runs on the calling thread.
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1
export OMP_TOOL_LIBRARIES=$archer
export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1
run "clang tsan codec and frames on threads" sharded "$clang_tsan/tests/unit_tests" --gtest_brief=1 \
  --gtest_filter='Codec.*:Ctx.ThreadsDoNotChangeTheBytes:Frame.ThreadsChangeNeitherTheBytesNorTheDecodedValues:BasisApi.FrameDecodesOnSeveralThreadsAtOnce:Streaming.WritesBehindKeepTheirBytesAndReportTheirFailures:Streaming.WritesBehindAtAnyPaceKeepTheirBytes:Streaming.ScratchWriterWritesTheSameBytes'
run "clang tsan all-reduce local steps on threads" "$clang_tsan/tests/mpi/transport_tests" \
  --gtest_brief=1 \
  --gtest_filter='LocalSteps.CodecThreadsDoNotChangeTheResult:LocalSteps.MessagesAreTheCodecsEncodeOfTheirShards'

[ "$failed" -eq 0 ] && echo "sanitize: passed" || echo "sanitize: FAILED"
exit "$failed"
