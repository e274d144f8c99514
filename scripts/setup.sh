#!/usr/bin/env bash
# Installs what the build and the tests need, only where it is missing, so a fresh Debian
# machine gets from a clone to a green test run with no manual step. Safe to run again.
set -euo pipefail

# Debian packages by name. The CUDA toolkit (nvcc, cuBLAS, NCCL) is not a Debian package
# here; CMake picks it up when present.
debs=(
  cmake ninja-build g++ pkg-config python3
  libgtest-dev libgmock-dev libbenchmark-dev
  libhwy-dev libomp-dev
  libopenblas-dev liblapacke-dev
  libflatbuffers-dev flatbuffers-compiler libzstd-dev libxxhash-dev
  libcli11-dev nlohmann-json3-dev zlib1g-dev libre2-dev
  openmpi-bin libopenmpi-dev
  clang libclang-rt-14-dev clang-format git
  python3-dev pybind11-dev
)

missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Arm64 cross compiler of the compile check (tests/cross), and QEMU's user mode, which
# runs the Arm64 tests built with it (the vector kernels' and the scalar rules' tests, the
# floating-point environment's): they only register where their programs are, so a machine
# that cannot install them loses those checks, not the others.
arm=()
for p in g++-aarch64-linux-gnu qemu-user; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || arm+=("$p")
done
if [ ${#arm[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${arm[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  { $sudo apt-get update -qq &&
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${arm[@]}" >/dev/null; } ||
    echo "setup: could not install ${arm[*]}; the Arm64 checks that need them are skipped" >&2
fi

# Python packages used only by the cross-check tests (independent references).
py=${PYTHON:-python3}
# (xxhash and zstandard let a test decode frames independently of libgift; safetensors
# cross-checks giftc's files.)
if ! "$py" -c 'import numpy, ml_dtypes, xxhash, zstandard, safetensors' 2>/dev/null; then
  echo "setup: installing Python packages: numpy ml_dtypes xxhash zstandard safetensors" >&2
  "$py" -m pip install --quiet numpy ml_dtypes xxhash zstandard safetensors
fi

# torch for the DDP hook's tests (Debian's, for /usr/bin/python3), only where those tests are
# built (the Python package is not switched off) and no python3 has it yet.
case " ${GIFT_CMAKE_ARGS:-} " in
  *" -DGIFT_PYTHON=OFF "*) ;;
  *)
    if ! "$py" -c 'import torch' 2>/dev/null && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
      echo "setup: installing Debian packages: python3-torch" >&2
      sudo=""
      [ "$(id -u)" -eq 0 ] || sudo="sudo"
      $sudo apt-get update -qq
      $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
    fi
    ;;
esac
