#!/bin/sh
# Installs the build into a temporary prefix and builds consumer.c against the installed tree
# the two ways users do, each run once:
#   1. a CMake project with find_package(gift CONFIG REQUIRED) and gift::gift (consumer/),
#      which runs through the RUNPATH CMake gives it;
#   2. cc $(pkg-config --cflags --libs gift), which runs with LD_LIBRARY_PATH.
# Either program may need libgift only: its private dependencies must not reach their links.
#
#   test_install.sh BUILD_DIR CMAKE C_COMPILER
set -eu
build=$1
cmake=$2
cc=$3
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gift-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log"

# Libraries a consumer's executable may need: libgift and the C library.
only_libgift() {
  needed=$(readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  extra=$(printf '%s\n' "$needed" | grep -v -e '^libgift\.so\.' -e '^libc\.so\.' || true)
  if [ -n "$extra" ]; then
    echo "test_install: $1 links more than libgift: $extra" >&2
    exit 1
  fi
}

generator=
if command -v ninja >/dev/null 2>&1; then generator="-G Ninja"; fi
# shellcheck disable=SC2086  # $generator is empty or two words
"$cmake" -S "$here/consumer" -B "$tmp/cmake-build" $generator -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$tmp/configure.log" ||
  { cat "$tmp/configure.log" >&2; exit 1; }
"$cmake" --build "$tmp/cmake-build" >"$tmp/build.log" || { cat "$tmp/build.log" >&2; exit 1; }
only_libgift "$tmp/cmake-build/consumer"
"$tmp/cmake-build/consumer"

PKG_CONFIG_PATH=$(dirname "$(find "$prefix" -name gift.pc)")
export PKG_CONFIG_PATH
libs=$(pkg-config --libs gift)
case "$libs" in
  *-lgift*) ;;
  *) echo "test_install: pkg-config --libs gift gives '$libs'" >&2; exit 1 ;;
esac
# shellcheck disable=SC2046  # pkg-config's flags are words
"$cc" -std=c99 -pedantic -Wall -Wextra -Werror "$here/consumer.c" -o "$tmp/consumer-pc" \
  $(pkg-config --cflags --libs gift)
only_libgift "$tmp/consumer-pc"
LD_LIBRARY_PATH=$(pkg-config --variable=libdir gift) "$tmp/consumer-pc"
