#!/usr/bin/env bash
# Installs what is missing, configures (once) and builds. BUILD_DIR picks the build folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}

"$root/scripts/setup.sh"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${GIFT_CMAKE_ARGS:-}
fi
cmake --build "$build" --parallel "$(nproc)"
