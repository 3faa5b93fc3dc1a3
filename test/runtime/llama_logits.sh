#!/bin/sh
# Regenerates test/data/kimi-k3-kv-b/ (llama.cpp's logits on the oracle's kimi-k3
# model written with attn_kv_b; test/runtime/test_kimi_kv_b.cpp reads them).
#
#   test/runtime/llama_logits.sh LLAMA_SRC [LLAMA_BUILD] [ORACLE]
#
# LLAMA_SRC: llama.cpp unpacked from ../shared/baselines/llama.cpp-13f76e69.tar.gz;
# LLAMA_BUILD: its CMake build folder holding libllama.so (default LLAMA_SRC/b; a
# CPU build as in test/data/kimi-k3-kv-b/README.md); ORACLE: ../shared/oracle.
# Builds test/runtime/llama_logits.cpp against that libllama (build_llama_logits.sh), writes the
# llama.cpp-readable variant (kimi_k3_kv_b.py --form mha --llama-q-order) and
# dumps both prompts, every row, 32 greedy tokens, 2 threads.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
src=$(cd "$1" && pwd)
build=${2:-$src/b}
oracle=${3:-$root/../shared/oracle}
out=$root/test/data/kimi-k3-kv-b
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$here/build_llama_logits.sh" "$src" "$build" "$tmp/llama_logits"

python3 "$here/kimi_k3_kv_b.py" "$oracle/models/kimi-k3-f32.gguf" "$tmp/kimi-k3-f32-kv-b-mha-q.gguf" \
  --form mha --llama-q-order
mkdir -p "$out"
for p in short long; do
  "$tmp/llama_logits" -m "$tmp/kimi-k3-f32-kv-b-mha-q.gguf" --ids "$oracle/prompts/$p.ids" -n 32 -t 2 \
    -o "$out/$p" 2>"$tmp/$p.log" || { cat "$tmp/$p.log"; exit 1; }
done
sha256sum "$tmp/kimi-k3-f32-kv-b-mha-q.gguf" "$out"/*.f32 "$out"/*.json
