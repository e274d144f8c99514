#!/usr/bin/env bash
# Builds the fuzzers (libFuzzer, under ASan and UBSan: the ASan tree of
# scripts/sanitized-build.sh), replays one fuzzer's regression inputs, then fuzzes it for a
# bounded time from its seeds.
#
#   tests/fuzz/run_fuzz.sh [BUILD_DIR] [TARGET]
#
# BUILD_DIR  the ASan tree (default: clang-asan in SANITIZE_BUILD_DIR, else in build-sanitize at
#            the repository's root: the one scripts/sanitize.sh builds and runs these from)
# TARGET     frame (default): frame_fuzzer, the GIFT frame and basis readers, from seeds that
#              make_seeds writes and the golden frames;
#            tensor_file: tensor_file_fuzzer, giftc's safetensors, .npy and .npz readers, from
#              the committed corpus in corpus/tensor_file.
# GIFT_FUZZ_SECONDS   fuzzing time in seconds (default 60 for frame, 30 for tensor_file; 0 only
#                     replays the regressions)
# GIFT_FUZZ_BUILT=1   BUILD_DIR's fuzzers are built already (scripts/sanitize.sh builds them
#                     once and runs both targets side by side)
#
# Exit status: 0 clean; 1 a regression input or a new input crashed (new ones are copied into
# tests/fuzz/regressions/TARGET/ to be committed), or the build failed; 77 clang or libFuzzer
# is missing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-${SANITIZE_BUILD_DIR:-$root/build-sanitize}/clang-asan}
target=${2:-frame}
case "$target" in
  frame) default_seconds=60 ;;
  tensor_file) default_seconds=30 ;;
  *)
    echo "run_fuzz: unknown target '$target' (frame or tensor_file)" >&2
    exit 1
    ;;
esac
seconds=${GIFT_FUZZ_SECONDS:-$default_seconds}
regressions=$here/regressions/$target

skip() {
  echo "run_fuzz: SKIPPED: $*" >&2
  exit 77
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gift-fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

if [ "${GIFT_FUZZ_BUILT:-0}" != 1 ]; then
  # clang, and the runtimes of libFuzzer and the sanitizers (Debian: libclang-rt-<N>-dev).
  command -v clang++ >/dev/null 2>&1 || skip "clang++ not found (Debian: apt-get install clang)"
  printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' \
    >"$tmp/probe.cc"
  if ! clang++ -fsanitize=fuzzer,address,undefined "$tmp/probe.cc" -o "$tmp/probe" 2>"$tmp/probe.err"; then
    skip "clang++ cannot link -fsanitize=fuzzer,address,undefined (libclang-rt-dev missing?): $(head -c 300 "$tmp/probe.err")"
  fi
  # One build at a time in a tree (sanitized-build.sh takes the tree's lock): two runs of this
  # script on one tree build in turn.
  "$root/scripts/sanitized-build.sh" asan "$build" frame_fuzzer tensor_file_fuzzer make_seeds \
    >"$tmp/build.log" 2>&1 || {
    tail -n 80 "$tmp/build.log" >&2
    echo "run_fuzz: FAILED: building $build" >&2
    exit 1
  }
  tail -n 1 "$tmp/build.log" | sed 's/^sanitized-build/run_fuzz/'
fi

fuzzer=$build/tests/fuzz/${target}_fuzzer
[ -x "$fuzzer" ] || {
  echo "run_fuzz: FAILED: no $fuzzer (a tree configured without GIFT_FUZZERS?)" >&2
  exit 1
}
# Tiny tensors decode fastest on one thread. Any UBSan report stops the fuzzer (a crash to
# libFuzzer): halt_on_error=1 comes last, so it wins over a caller's UBSAN_OPTIONS.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1
limits=(-rss_limit_mb=2048 -timeout=25)

# (a) Every committed regression input must run clean; each runs alone, so all failures show.
mapfile -t replay < <(find "$regressions" -type f ! -name '*.md' 2>/dev/null | sort)
failed=0
for f in "${replay[@]}"; do
  if ! "$fuzzer" "${limits[@]}" "$f" >"$tmp/replay.log" 2>&1; then
    failed=$((failed + 1))
    [ "$failed" -gt 1 ] || cp "$tmp/replay.log" "$tmp/first-failure.log"
    why=$(grep -m1 -E 'runtime error|==ERROR|contract broken|ERROR: libFuzzer' "$tmp/replay.log" || true)
    echo "run_fuzz: regression ${f#"$root"/}: ${why:-exit status not 0}" >&2
  fi
done
if [ "$failed" -gt 0 ]; then
  echo "run_fuzz: the first failure in full:" >&2
  grep -v '^INFO:' "$tmp/first-failure.log" | head -n 60 >&2
  echo "run_fuzz: FAILED: $failed of ${#replay[@]} regression inputs fail (listed above)" >&2
  exit 1
fi
echo "run_fuzz: replayed ${#replay[@]} regression inputs, all clean"
[ "$seconds" -gt 0 ] || exit 0

# (b) Seeds, gathered in a temporary folder (new corpus entries go to another).
mkdir -p "$tmp/seeds" "$tmp/corpus" "$tmp/artifacts"
if [ "$target" = frame ]; then
  # Valid frames of every kind (written under the same sanitizers), and the golden frames.
  if ! "$build/tests/fuzz/make_seeds" "$tmp/seeds" 2>"$tmp/seeds.log"; then
    cat "$tmp/seeds.log" >&2
    echo "run_fuzz: FAILED: make_seeds" >&2
    exit 1
  fi
  if [ -d "$root/format/testdata" ]; then
    find "$root/format/testdata" -type f -name '*.gift' -size -65537c -print0 |
      while IFS= read -r -d '' f; do cp "$f" "$tmp/seeds/golden_$(basename "$(dirname "$f")")_$(basename "$f")"; done
  fi
else
  cp "$here/corpus/$target"/* "$tmp/seeds/"
fi
# The regression inputs seed it too, except large ones (replayed above only): libFuzzer starts
# mutating at the length of its largest seed, and 64 KiB inputs would slow every run.
for f in "${replay[@]}"; do
  [ "$(stat -c %s "$f")" -gt 16384 ] || cp "$f" "$tmp/seeds/regression_$(basename "$f")"
done
echo "run_fuzz: $(find "$tmp/seeds" -type f | wc -l) seeds; fuzzing for $seconds s"

rc=0
"$fuzzer" "${limits[@]}" -max_len=65536 -max_total_time="$seconds" -print_final_stats=1 \
  -artifact_prefix="$tmp/artifacts/" "$tmp/corpus" "$tmp/seeds" >"$tmp/fuzz.log" 2>&1 ||
  rc=$?
cp "$tmp/fuzz.log" "$build/last-fuzz-$target.log"
grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' \
  "$tmp/fuzz.log" | sed 's/^/run_fuzz:   /' || true

# (c) A crash, leak, timeout or out-of-memory input becomes a regression input.
mapfile -t found < <(find "$tmp/artifacts" -type f | sort)
if [ ${#found[@]} -gt 0 ]; then
  mkdir -p "$regressions"
  grep -A 40 -E '^==[0-9]+==ERROR|runtime error|ERROR: libFuzzer|contract broken' "$tmp/fuzz.log" |
    head -n 80 >&2 || true
  for f in "${found[@]}"; do
    cp "$f" "$regressions/"
    echo "run_fuzz: FAILED: new crashing input saved as $regressions/$(basename "$f")" >&2
  done
  echo "run_fuzz: full log: $build/last-fuzz-$target.log" >&2
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  tail -n 60 "$tmp/fuzz.log" >&2
  echo "run_fuzz: FAILED: the fuzzer exited with $rc" >&2
  exit 1
fi
echo "run_fuzz: no crash in $seconds s"
