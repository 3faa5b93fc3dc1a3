#!/usr/bin/env bash
# The end-to-end benchmark (GPU machine): a real-shaped synthetic model (random weights)
# decoded by xpack-run and by llama.cpp side by side in one run, with host RAM capped by a
# cgroup and the expert cache sized at the seed's ratios (doc/benchmarks.md, "End to end").
#
# usage: bench/e2e.sh [--arch deepseek4|kimi-k3] [--layers N] [--dir DIR] [--out DIR]
#                     [--prompts N] [--tokens N] [--configs a,b,bp,c,d] [--config-budget S]
#                     [--llama-tarball PATH] [--ram-ratio R] [--cache-ratio R] [--vram-ratio R]
#                     [--synth-args "ARGS"] [--device cuda|cpu] [--build DIR] [--deadline S]
#   --deadline: no run starts, and none lasts, past S seconds after the script started
#   (0: none), so the summary is still printed within a command's time limit;
#   --synth-args: more xpack-synth flags (e.g. "--experts 8 --ff 512" for a smoke test);
#   --device cpu: xpack-run on the CPU (a smoke test of this script off the GPU machine)
#   --llama-tarball: llama.cpp's sources (default .deps/llama.cpp-*.tar.gz), built here, or
#   bench/llama-prebuild.sh's bundle, built on the CPU machine: unpacked, no build
#
# Configurations (the benchmark issue's letters):
#   a   xpack-run --device cuda, experts streamed from the pack through a cache of
#       cache-ratio x pack bytes, with xpack-run's default host-RAM tier (3/4 of what the
#       cgroup leaves above 1 GiB)
#   a0  (a) without the host tier (--host-cache-mib 0): the tier's ablation
#   n   (a0) without overlap (--no-overlap: a MoE layer computes once all its experts
#       are loaded, as the seed's engine does): the ablation's baseline
#   ap  (a) with the next-layer guess (--prefetch-next top-k): its ablation
#   al  (a) with LRU instead of the adaptive eviction policy (--cache-policy lru)
#   a1  (a) with every missed expert of a layer in flight at once, landing together
#       (--read-splits 1 --queue-depth 64, libxpack's defaults): the ablation of
#       xpack-run's in-order reads (8 ranges an expert, 8 in flight)
#   ah  (a) without the hash-routed layers' exact prefetch (--no-hash-prefetch; deepseek4)
#   av  (a) without the xxh3 check of each expert read (--no-verify-experts): what it costs
#   b   llama.cpp, everything but the experts on the GPU, the experts on the CPU through
#       mmap (--n-cpu-moe = every layer)
#   bp  llama.cpp, as many whole layers on the GPU (-ngl N) as fit in vram-ratio x model
#       bytes, the rest on the CPU through mmap (what Ollama did in the seed's baseline)
#   c   llama.cpp, everything in VRAM (-ngl 99): the compute ceiling
#   d   xpack-run --device cuda with every expert resident (the pack, a cache of its
#       size, --preload-experts: the same slots and kernels as (a), no read in a token):
#       our ceiling
# Every configuration runs in a memory cgroup of ram-ratio x model bytes, each prompt a
# fresh process (so our cache starts cold per prompt, llama.cpp's page cache does not), one
# at a time, greedy, --ignore-eos. A configuration that passes --config-budget seconds stops
# before its next prompt and says how many it ran. Phases whose results exist in --dir
# (built llama.cpp, the model, its pack) are not redone, so a second call on a warm machine
# continues. The summary (bench/e2e_report.py) is printed last and written to
# OUT/summary.json; OUT/runs.jsonl has one line per run, OUT/logs/ every run's output.
# The results name the tree measured: XPACK_TREE=<commit> when the checkout's .git is not the
# tree's (the device tool's copy), else HEAD's hash, with "+changes" when files differ from it.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# shellcheck source=bench/e2e-setup.sh
. "$root/bench/e2e-setup.sh"
arch=deepseek4 layers="" dir=/root/e2e out="${OUT:-$root/build-gpu}/e2e"
prompts=10 tokens=200 configs="a,b,bp,c,d" budget=600 deadline=0
tarball="$(ls "$root"/.deps/llama.cpp-*.tar.gz 2>/dev/null | head -1)"
# The seed's consumer PC: 32 GB of RAM and a 32 GB GPU for a 155 GB model, a 21 GiB expert
# cache for a 147 GB pack (DeepSeek-V4-Flash); Kimi-K3: 5 GiB for 986 GB.
ram_ratio=$(python3 -c 'print(32/155)') vram_ratio=$(python3 -c 'print(32/155)') cache_ratio=""
build="$root/build-gpu" synth_args="" device=cuda
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --prompts) prompts="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --configs) configs="$2"; shift 2 ;;
    --config-budget) budget="$2"; shift 2 ;;
    --deadline) deadline="$2"; shift 2 ;;
    --llama-tarball) tarball="$2"; shift 2 ;;
    --ram-ratio) ram_ratio="$2"; shift 2 ;;
    --vram-ratio) vram_ratio="$2"; shift 2 ;;
    --cache-ratio) cache_ratio="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --synth-args) synth_args="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    -h|--help) e2e_help "$0"; exit 0 ;;
    *) echo "e2e: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
case "$arch" in
  deepseek4) preset=deepseek-v4-flash; layers="${layers:-6}"; cache_ratio="${cache_ratio:-$(python3 -c 'print(21*2**30/147e9)')}" ;;
  kimi-k3) preset=kimi-k3; layers="${layers:-3}"; cache_ratio="${cache_ratio:-$(python3 -c 'print(5*2**30/986e9)')}" ;;
  *) echo "e2e: --arch is deepseek4 or kimi-k3" >&2; exit 2 ;;
esac
mkdir -p "$out/logs" "$dir"
t0=$(date +%s)
say() { echo "e2e [$(( $(date +%s) - t0 )) s]: $*"; }

# --- build: ours (meson, CUDA) and llama.cpp (in the background, ~5 min on 16 cores)
llama="$dir/llama.cpp"
if [[ ",$configs," =~ ,(b|bp|c), ]]; then
  e2e_build_llama b ON llama-completion llama-bench > "$out/logs/llama-build-status.log" 2>&1 &
  llama_pid=$!
fi
e2e_build_ours

# --- the model and its pack
e2e_model

# --- the disk, measured by fio on the pack in this run, O_DIRECT random reads in two
# shapes: the cache's own (whole objects, 8 in flight) and 1 MiB x 32 in flight; the
# disk's bandwidth is the better of the two.
fio="$(command -v fio || echo "$root/.deps/bin/fio")"
for shape in "obj $stride 8" "1m 1M 32"; do
  set -- $shape
  "$fio" --name=e2e --filename="$base.xpack" --readonly --direct=1 --rw=randread --bs="$2" --iodepth="$3" \
    --ioengine=io_uring --runtime=10 --time_based --output-format=json > "$out/fio-$1.json" 2> "$out/logs/fio-$1.err" ||
    say "fio failed: $(tail -2 "$out/logs/fio-$1.err")"
  say "fio $2 x $3: $(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('%.2f GB/s' % (j['jobs'][0]['read']['bw_bytes']/1e9))" "$out/fio-$1.json" 2>/dev/null)"
done

if [ -n "${llama_pid:-}" ]; then
  # Nothing is measured while it builds (it would take the CPU from the runs).
  wait "$llama_pid"; say "llama.cpp build: $( [ -x "$llama/b/bin/llama-completion" ] && echo ok || { echo FAILED; tail -3 "$out/logs/llama-build-status.log"; } )"
fi

# --- the RAM cap: this shell and everything it starts from here on
e2e_cap_ram

# The seed's ratio, but never below one token's top-k objects (the least a cache can serve:
# Kimi-K3's 5 GiB/986 GB of a few-layer pack holds fewer than its 16).
top_k=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['n_experts_used'])" "$base.xpack.json")
cache_mib=$(python3 -c "print(round(max($cache_ratio * $pack_bytes, $top_k * $stride) / 2**20 + 0.05, 1))")
cache_floor=$(python3 -c "print($top_k * $stride > $cache_ratio * $pack_bytes)")
all_mib=$(python3 -c "print(round($pack_bytes / 2**20 + 64, 1))")
layer_bytes=$(python3 -c "print(($pack_bytes) / $layers)")
ngl_bp=$(python3 -c "print(int($vram_ratio * $model_bytes // $layer_bytes))")
python3 - "$out/meta.json" <<EOF
import json, sys, os
json.dump({"arch": "$arch", "preset": "$preset", "layers": $layers, "model_bytes": $model_bytes,
           "pack_bytes": $pack_bytes, "object_stride": $stride, "ram_cap_bytes": $cap, "ram_capped": "$capped" == "yes",
           "ram_ratio": $ram_ratio, "cache_ratio": $cache_ratio, "cache_mib": $cache_mib, "cache_at_top_k_floor": $cache_floor,
           "vram_ratio": $vram_ratio, "ngl_bp": $ngl_bp, "prompts": $prompts, "tokens": $tokens,
           "configs": "$configs", "device": "$device", "synth_args": "$synth_args", "config_budget_s": $budget, "gpu": os.popen("nvidia-smi --query-gpu=name --format=csv,noheader").read().strip(),
           "git": "$(e2e_tree)"}, open(sys.argv[1], "w"), indent=1)
EOF

mapfile -t texts < <(grep -v '^#' "$root/bench/e2e-prompts.txt" | grep -v '^$')
: > "$out/runs.jsonl"
run_config() {
  local cfg="$1" start i n_done=0
  evict "$model" "$base.trunk.gguf"
  start=$(date +%s)
  for (( i = 0; i < prompts && i < ${#texts[@]}; i++ )); do
    if [ $(( $(date +%s) - start )) -ge "$budget" ]; then say "$cfg: budget of $budget s spent after $n_done prompts"; break; fi
    local log="$out/logs/$cfg-$i.log" cmd
    local common_llama=(-c 1024 -fit off -t 16 --temp 0 --ignore-eos -n "$tokens" -no-cnv --no-display-prompt -p "${texts[$i]}")
    local common_ours=(-c 1024 --greedy --ignore-eos -n "$tokens" --json -p "${texts[$i]}")
    # Ours from the pack; streamed through a cache of cache-ratio x the pack unless (d).
    local ours=("$build/examples/xpack-run" -m "$base.trunk.gguf" --pack "$base.xpack" --device "$device")
    local streamed=("${ours[@]}" --cache-mib "$cache_mib")
    case "$cfg" in
      a) cmd=("${streamed[@]}" "${common_ours[@]}") ;;
      ap) cmd=("${streamed[@]}" --prefetch-next "$top_k" "${common_ours[@]}") ;;
      n) cmd=("${streamed[@]}" --host-cache-mib 0 --no-overlap "${common_ours[@]}") ;;
      al) cmd=("${streamed[@]}" --cache-policy lru "${common_ours[@]}") ;;
      a1) cmd=("${streamed[@]}" --read-splits 1 --queue-depth 64 "${common_ours[@]}") ;;
      ah) cmd=("${streamed[@]}" --no-hash-prefetch "${common_ours[@]}") ;;
      av) cmd=("${streamed[@]}" --no-verify-experts "${common_ours[@]}") ;;
      a0) cmd=("${streamed[@]}" --host-cache-mib 0 "${common_ours[@]}") ;;
      d) cmd=("${ours[@]}" --cache-mib "$all_mib" --preload-experts "${common_ours[@]}") ;;
      b) cmd=("$llama/b/bin/llama-completion" -m "$model" -ngl 99 -ncmoe "$layers" "${common_llama[@]}") ;;
      bp) cmd=("$llama/b/bin/llama-completion" -m "$model" -ngl "$ngl_bp" "${common_llama[@]}") ;;
      c) cmd=("$llama/b/bin/llama-completion" -m "$model" -ngl 99 "${common_llama[@]}") ;;
      *) say "unknown configuration $cfg"; return ;;
    esac
    # One prompt may outlast the budget (llama.cpp through mmap: ~90 s for 32 tokens).
    local t1 rc limit=600; t1=$(date +%s.%N)
    if [ "$deadline" -gt 0 ]; then
      local left=$(( deadline - ($(date +%s) - t0) ))
      if [ "$left" -lt 20 ]; then say "$cfg: --deadline reached after $n_done prompts"; break; fi
      [ "$left" -lt "$limit" ] && limit=$left
    fi
    timeout "$limit" "${cmd[@]}" > "$log.out" 2> "$log" < /dev/null; rc=$?
    python3 "$root/bench/e2e_report.py" --parse "$cfg" "$i" "$rc" "$log.out" "$log" "$t1" >> "$out/runs.jsonl"
    n_done=$(( n_done + 1 ))
  done
  say "$cfg: $n_done prompts in $(( $(date +%s) - start )) s"
}
for cfg in ${configs//,/ }; do
  if [[ "$cfg" =~ ^(b|bp|c)$ ]] && [ ! -x "$llama/b/bin/llama-completion" ]; then say "$cfg: skipped, llama.cpp not built"; continue; fi
  run_config "$cfg"
done
python3 "$root/bench/e2e_report.py" --summary "$out/meta.json" "$out/runs.jsonl" "$out"/fio-*.json > "$out/summary.json"
tar czf "$out/logs.tar.gz" -C "$out" logs runs.jsonl && rm -rf "$out/logs"
python3 "$root/bench/e2e_report.py" --table "$out/summary.json"
