#!/bin/sh
# The README's main job on bundled small models: make a synthetic Kimi-K3-shaped MoE
# model as a 3-shard split set, convert it to an Expert Pack, inspect and verify the pack,
# then generate text with xpack-run on the bundled stories260K model, first from the plain
# GGUF and then from its Mixtral-style MoE form streamed through an Expert Pack.
# Usage: tools/demo.sh BUILD_DIR [WORK_DIR]
set -eu
build=${1:-build}
work=${2:-$build/demo}
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
rm -f "$work"/*.gguf "$work"/*.xpack "$work"/*.json

echo "== 1. synthetic Kimi-K3-shaped MoE model, 3 shards"
"$build/tools/xpack-synth" --arch kimi-k3 --layers 6 --experts 16 --top-k 4 --shards 3 \
  -o "$work/synth-kimi.gguf"
ls -l "$work"/synth-kimi-*.gguf

echo "== 2. convert to an Expert Pack (any shard names the set)"
"$build/tools/xpack-build" "$work/synth-kimi-00002-of-00003.gguf" -o "$work/synth-kimi" --verify

echo "== 3. inspect and verify every object checksum"
"$build/tools/xpack-inspect" "$work/synth-kimi.xpack" --verify

echo "== 4. generate with the bundled stories260K model (plain GGUF)"
"$build/examples/xpack-run" -m "$src/test/data/stories260K.gguf" -p "Once" -n 48

if [ -f "$src/test/data/stories260K-moe.gguf" ]; then
  echo "== 5. the same model as a 4-expert MoE, experts streamed from an Expert Pack"
  "$build/tools/xpack-build" "$src/test/data/stories260K-moe.gguf" -o "$work/stories-moe"
  "$build/examples/xpack-run" -m "$work/stories-moe.trunk.gguf" --pack "$work/stories-moe.xpack" \
    --cache-mib 1 -p "Once" -n 48
fi
echo "== demo finished"
