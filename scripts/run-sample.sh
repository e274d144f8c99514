#!/usr/bin/env bash
# The main job on the bundled samples: set-up and build as needed, then giftc on a real
# gradient dump (fit a GIFT basis from its activation statistics, encode, inspect, decode,
# compare against plain Euclidean FP8), and the error table of every FP8 setting on one
# tensor. Outputs go to build/sample-out/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}

"$root/scripts/build.sh" >&2
giftc="$build/cli/giftc"
out="$build/sample-out"
mkdir -p "$out"
s="$root/samples"

set -x
"$giftc" fit "$s/llama_grads.npz" --activations "$s/llama_acts.npz" -o "$out/llama.giftb" -f
"$giftc" encode "$s/llama_grads.npz" --basis "$out/llama.giftb" --embed-basis -o "$out/llama.gift" -f
"$giftc" inspect "$out/llama.gift" --verify
"$giftc" decode "$out/llama.gift" -o "$out/llama.decoded.safetensors" -f
"$giftc" encode "$s/llama_grads.npz" -o "$out/llama.euclidean.gift" -f
"$giftc" compare "$s/llama_grads.npz" "$out/llama.euclidean.gift"
"$giftc" compare "$s/llama_grads.npz" "$out/llama.decoded.safetensors"
"$build/samples/error_table" "$s/grad_sample.npy" "$@"
