#!/bin/sh
# Run HERE (a Debian 12 machine with network), from the repository root, before sending
# bench/gpu-check.sh to the GPU machine (Ubuntu 24.04, no network). Fills .deps/ (ignored
# by git; carry it) with what that machine lacks:
#   - liburing, xxHash, nlohmann-json, CLI11 .debs (installed there by .deps/install-debs.sh);
#   - a static fio 3.33 built from Debian's source package (.deps/bin/fio), the baseline
#     of bench/compare-fio.sh (Debian's fio binary needs ~60 shared libraries);
#   - Python wheels of gguf and its pure dependencies for the test suite's cross-checks, and
#     pytest with its own (the python suite; the GPU machine has torch, not pytest).
# On the GPU machine: sh .deps/install-debs.sh && PATH=$PWD/.deps/bin:$PATH \
#   python3 -m pip install --no-index --no-deps .deps/wheels/*.whl; bench/gpu-check.sh
# apt-get source needs deb-src entries in /etc/apt/sources.list.d.
set -eu
../shared/device/fetch-debs.sh
(cd .deps && apt-get download nlohmann-json3-dev libcli11-dev)
mkdir -p .deps/wheels .deps/bin
pip download gguf pyyaml tqdm requests urllib3 idna certifi charset-normalizer \
  pytest pluggy iniconfig packaging pygments --no-deps \
  --python-version 3.12 --only-binary=:all: --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 -d .deps/wheels
if [ ! -x .deps/bin/fio ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get source --download-only fio && tar xzf fio_*.orig.tar.gz &&
   cd fio-*/ && ./configure --build-static --disable-native && make -j"$(nproc)" fio)
  cp "$tmp"/fio-*/fio .deps/bin/fio && strip .deps/bin/fio
  rm -rf "$tmp"
fi
ls -l .deps .deps/bin .deps/wheels
