#!/usr/bin/env bash
# The main job on the bundled sample: set-up and build as needed, then encode
# samples/grad_sample.npy to FP8 under each scale layout and print the error table.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}

"$root/scripts/build.sh" >&2
"$build/samples/error_table" "$root/samples/grad_sample.npy" "$@"
