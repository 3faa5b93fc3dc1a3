#!/bin/sh
# Installs what libxpack needs to build and test on Debian 12 (run as root).
# Idempotent: packages already present are left alone.
set -eu
pkgs="build-essential pkg-config meson ninja-build liburing-dev libxxhash-dev libssl-dev
      libnuma-dev libfmt-dev nlohmann-json3-dev libcli11-dev doctest-dev python3 python3-pip
      python3-numpy python3-pytest python3-jinja2 fio libcpp-httplib-dev"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "install-deps: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing
fi
# The tests cross-check against llama.cpp's own Python GGUF package (test-only).
if ! python3 -c 'import gguf' 2>/dev/null; then
  echo "install-deps: installing the gguf Python package (tests only)"
  python3 -m pip install -q gguf 2>/dev/null || python3 -m pip install -q --break-system-packages gguf
fi
# The server's tests talk to it through the official OpenAI Python client (test-only).
if ! python3 -c 'import openai' 2>/dev/null; then
  echo "install-deps: installing the openai Python package (tests only)"
  python3 -m pip install -q openai 2>/dev/null || python3 -m pip install -q --break-system-packages openai
fi
# The python suite runs pytest with the `python3` on PATH, which need not be Debian's
# (a pyenv interpreter first on PATH does not see python3-pytest or python3-jinja2).
for mod in pytest jinja2; do
  if ! python3 -c "import $mod" 2>/dev/null; then
    echo "install-deps: installing the $mod Python package for $(command -v python3) (tests only)"
    python3 -m pip install -q "$mod" 2>/dev/null || python3 -m pip install -q --break-system-packages "$mod"
  fi
done
