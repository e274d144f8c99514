#!/usr/bin/env bash
# The whole test suite from a fresh clone: set-up, build, then every test through ctest, then
# the sanitizer job (scripts/sanitize.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}

"$root/scripts/build.sh"
ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" --timeout 900 "$@"
# The library and giftc built again under sanitizers (Clang with ASan and UBSan, Clang with
# TSan), and their tests on them.
"$root/scripts/sanitize.sh"
