#!/bin/sh
# Builds test/runtime/llama_logits.cpp against a llama.cpp build's libllama.
#
#   test/runtime/build_llama_logits.sh LLAMA_SRC LLAMA_BUILD OUT
#
# LLAMA_SRC: llama.cpp unpacked from ../shared/baselines/llama.cpp-13f76e69.tar.gz;
# LLAMA_BUILD: its CMake build folder holding libllama.so (a CPU build as in
# test/data/kimi-k3-kv-b/README.md); OUT: the program to write (rpath set to the
# libraries' folders, so it runs from anywhere).
set -eu
[ $# -eq 3 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$1" && pwd)
lib=$(dirname "$(find "$2" -name 'libllama.so' | head -n 1)")
ggml_lib=$(dirname "$(find "$2" -name 'libggml.so' | head -n 1)")
[ -f "$lib/libllama.so" ] || { echo "build_llama_logits: no libllama.so under $2" >&2; exit 1; }
c++ -std=c++17 -O2 -I"$src/include" -I"$src/ggml/include" "$here/llama_logits.cpp" \
  -L"$lib" -L"$ggml_lib" -lllama -lggml -lggml-base -Wl,-rpath,"$lib:$ggml_lib" -o "$3"
