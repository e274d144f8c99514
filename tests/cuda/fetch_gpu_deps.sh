#!/usr/bin/env bash
# Run on a Debian machine WITH network, before lending the work tree to a GPU machine that
# has CUDA but neither network nor our Debian -dev packages: downloads the .deb files the
# CUDA build needs into .gpu-deps/ (ignored by git, about 18 MB), which run_on_gpu.sh then
# unpacks into a private prefix there. Carry the folder with the tree, e.g.
#
#   bash tests/cuda/fetch_gpu_deps.sh        # here
#   bash tests/cuda/run_on_gpu.sh            # there, with .gpu-deps/ carried along
#
# The list is the build's requirements (cmake/GiftOptions.cmake, cli/, tests/) with their
# libraries, minus what any system with a C++ compiler has (libc, libstdc++, libgomp), plus
# pybind11's headers for the Python package (any Python 3; the interpreter with torch there
# brings its own headers, as pip's and conda's do, when its pybind11 is not installed).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest="$root/.gpu-deps"
packages=(
  pkgconf pkgconf-bin libpkgconf3
  libhwy-dev libhwy1
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0
  liblapacke-dev liblapacke libtmglib-dev libtmglib3 libgfortran5 libquadmath0
  libflatbuffers-dev libflatbuffers2 flatbuffers-compiler flatbuffers-compiler-dev
  libzstd-dev libzstd1 libxxhash-dev libxxhash0 zlib1g-dev zlib1g
  libcli11-dev nlohmann-json3-dev libre2-dev libre2-9
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
  pybind11-dev
)
rm -rf "$dest"
mkdir -p "$dest"
cd "$dest"
# apt-get download fetches the candidate version of each package, as apt-get install would.
sandbox=()
[ "$(id -u)" -ne 0 ] || sandbox=(-o APT::Sandbox::User=root)  # root writes here itself
apt-get "${sandbox[@]}" download "${packages[@]}"
debs=(./*.deb)
echo "fetch_gpu_deps: ${#debs[@]} packages, $(du -sh . | cut -f1), in $dest" >&2
