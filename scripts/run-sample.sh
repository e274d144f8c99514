#!/usr/bin/env bash
# The main job on the bundled sample: set-up and build as needed, then giftc encode, inspect,
# decode and compare on samples/grad_sample.npy, and the error table of every FP8 setting.
# Outputs go to build/sample-out/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}

"$root/scripts/build.sh" >&2
giftc="$build/cli/giftc"
out="$build/sample-out"
mkdir -p "$out"
sample="$root/samples/grad_sample.npy"

set -x
"$giftc" encode "$sample" -o "$out/grad_sample.gift" -f
"$giftc" inspect "$out/grad_sample.gift" --verify
"$giftc" decode "$out/grad_sample.gift" -o "$out/grad_sample.decoded.npy" -f
"$giftc" compare "$sample" "$out/grad_sample.decoded.npy"
"$build/samples/error_table" "$sample" "$@"
