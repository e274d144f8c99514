#!/usr/bin/env bash
# The whole test suite from a fresh clone: set-up, build, then every test through ctest, then
# the sanitizer job (scripts/sanitize.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}

"$root/scripts/build.sh"
ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" --timeout 900 "$@"
# The same library and giftc built with Clang under ASan and UBSan, and their tests again.
"$root/scripts/sanitize.sh"
