#!/bin/sh
# The README's main job on bundled small models: make a synthetic Kimi-K3-shaped MoE
# model as a 3-shard split set, convert it to an Expert Pack, inspect and verify the pack,
# then generate text with xpack-run on the bundled stories260K model, first from the plain
# GGUF and then from its Mixtral-style MoE form (made by a test script with the gguf
# Python package) with experts streamed through an Expert Pack and a tiny cache.
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

echo "== 5. the same model split into 4 experts (Mixtral form), experts streamed from an Expert Pack"
python3 "$src/test/runtime/make_moe_fixture.py" "$src/test/data/stories260K.gguf" "$work/stories260K-moe.gguf"
"$build/tools/xpack-build" "$work/stories260K-moe.gguf" -o "$work/stories-moe"
"$build/examples/xpack-run" -m "$work/stories-moe.trunk.gguf" --pack "$work/stories-moe.xpack" \
  --cache-mib 0.2 -p "Once" -n 48 --stats "$work/stories-moe.stats.json"
echo "engine counters: $work/stories-moe.stats.json"
echo "== demo finished"
