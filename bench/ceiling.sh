#!/usr/bin/env bash
# The compute-ceiling benchmark (GPU machine): prefill and decode speed of xpack-run with
# every expert resident, at several context lengths, next to llama.cpp with everything in
# VRAM (llama-bench -ngl 99), on the same synthetic model (random weights) in the same call
# (doc/benchmarks.md, "Compute ceiling").
#
# usage: bench/ceiling.sh [--arch deepseek4|kimi-k3] [--layers N] [--dir DIR] [--out DIR]
#                         [--contexts D1,D2,...] [--tokens N] [--reps R] [--no-llama]
#                         [--llama-tarball PATH] [--ram-ratio R] [--synth-args "ARGS"]
#                         [--device cuda|cpu] [--build DIR] [--deadline S] [--profile D1,...]
#                         [--against DIR] [--against-args "ARGS"]
#   --contexts: prompt lengths D (default 512,2048,4096): per D an xpack-run process
#     prefills D token ids and decodes --tokens (default 64) more at context D..D+N;
#     llama-bench measures pp D (-p D) and tg N at depth D (-n N -d D), the first D twice
#     (a run's first test has come out slow: the report keeps the second); both --reps times
#     each (default 3; ours: a process each, every context once before any twice, its
#     table row the median)
#   --deadline: no run starts, and none lasts, past S seconds after the script started
#     (0: none), so the summary is still printed within a command's time limit
#   --no-llama: ours only (also what happens, said so, when llama.cpp cannot be built)
#   --llama-tarball: llama.cpp's sources (default .deps/llama.cpp-*.tar.gz), built here, or
#     bench/llama-prebuild.sh's bundle, built on the CPU machine: unpacked, no build
#   --profile D1,...: after the timed runs, one more of ours per D with --profile-ops
#     (CUDA; 16 decoded tokens): OUT/profile-D.txt, its decode table's first rows printed
#     (profiled runs are slower and not in the table)
#   --device cpu: both on the CPU, llama.cpp built without CUDA in DIR/llama.cpp/b-cpu
#     (a smoke test of this script off the GPU machine)
#   --against DIR: another build of xpack-run (DIR/examples/xpack-run, e.g. the tree before
#     a change, built beside this one) run with the same arguments right before each of
#     ours, so both meet the same machine state; the table adds its times and ours' speed-up
#   --against-args "ARGS": more xpack-run flags for the --against runs only (without
#     --against: this build, e.g. --against-args "--prefill-precision bf16")
#
# Ours is bench/e2e.sh's configuration (d): the trunk and the pack, an expert cache of the
# pack's size, --preload-experts (the same slots and kernels as the streamed runs, no read
# in a token), greedy, --ignore-eos, --json. Its prompt is D pseudo-random ids below the
# vocabulary (the same seed for every run; llama-bench draws its own random ids). Its KV
# caches grow with the sequence (no context flag: -c only caps the model's trained
# context, which the presets set to 1M); the VRAM plan it prints at load is recorded, and
# on CUDA the GPU's memory in use is sampled through each run (nvidia-smi), so "fitted"
# means: the run ended well and its peak stayed below the GPU's memory.
# The model, its pack and the llama.cpp build are bench/e2e.sh's (bench/e2e-setup.sh, the
# same names in --dir): a warm machine builds nothing. Everything runs in e2e.sh's memory
# cgroup (ram-ratio x model bytes). OUT/ceiling.json holds the numbers
# (bench/ceiling_report.py), OUT/logs.tar.gz every run's output; the table is printed last.
# The results name the tree measured: XPACK_TREE=<commit> when the checkout's .git is not the
# tree's (the device tool's copy), else HEAD's hash, with "+changes" when files differ from it.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 1
# shellcheck source=bench/e2e-setup.sh
. "$root/bench/e2e-setup.sh"
arch=deepseek4 layers="" dir=/root/e2e out="${OUT:-$root/build-gpu}/ceiling"
contexts=512,2048,4096 tokens=64 reps=3 deadline=0 use_llama=yes profile="" against="" against_args=""
tarball="$(ls "$root"/.deps/llama.cpp-*.tar.gz 2>/dev/null | head -1)"
ram_ratio=$(python3 -c 'print(32/155)')  # bench/e2e.sh's: the seed's 32 GB PC, 155 GB model
build="$root/build-gpu" synth_args="" device=cuda
need() { [ $# -ge 2 ] || { echo "ceiling: $1 needs a value (--help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --arch|--layers|--dir|--out|--contexts|--tokens|--reps|--deadline|--llama-tarball|--ram-ratio|--build|--synth-args|--device|--profile|--against|--against-args) need "$@" ;;&
    --arch) arch="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --contexts) contexts="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --deadline) deadline="$2"; shift 2 ;;
    --llama-tarball) tarball="$2"; shift 2 ;;
    --ram-ratio) ram_ratio="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --synth-args) synth_args="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --profile) profile="$2"; shift 2 ;;
    --against) against="$2"; shift 2 ;;
    --against-args) against_args="$2"; shift 2 ;;
    --no-llama) use_llama=no; shift ;;
    -h|--help) e2e_help "$0"; exit 0 ;;
    *) echo "ceiling: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
case "$arch" in
  deepseek4) preset=deepseek-v4-flash; layers="${layers:-6}" ;;
  kimi-k3) preset=kimi-k3; layers="${layers:-3}" ;;
  *) echo "ceiling: --arch is deepseek4 or kimi-k3" >&2; exit 2 ;;
esac
case "$device" in cuda|cpu) ;; *) echo "ceiling: --device is cuda or cpu" >&2; exit 2 ;; esac
for v in "$layers" "$tokens" "$reps" "$deadline"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "ceiling: --layers, --tokens, --reps and --deadline are whole numbers, got '$v'" >&2; exit 2; }
done
[[ "$contexts" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "ceiling: --contexts is a list such as 512,2048,4096, got '$contexts'" >&2; exit 2; }
[ -z "$profile" ] || [[ "$profile" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "ceiling: --profile is a list such as 512,4096, got '$profile'" >&2; exit 2; }
[ -z "$profile" ] || [ "$device" = cuda ] || { echo "ceiling: --profile needs --device cuda (--profile-ops times the GPU's stream)" >&2; exit 2; }
[ "$tokens" -ge 1 ] && [ "$reps" -ge 1 ] || { echo "ceiling: --tokens and --reps are at least 1" >&2; exit 2; }
if [ -n "$against" ]; then
  against="$(cd "$against" 2>/dev/null && pwd)" && [ -x "$against/examples/xpack-run" ] ||
    { echo "ceiling: --against needs a build directory holding examples/xpack-run" >&2; exit 2; }
elif [ -n "$against_args" ]; then
  against="$build"  # built below, like ours
fi
mkdir -p "$out/logs" "$dir"
rm -f "$out"/llama-*.json "$out"/llama-*.rc "$out/llama-skipped.txt" "$out/runs.jsonl" "$out/ceiling.json"  # a previous call's
t0=$(date +%s)
say() { echo "ceiling [$(( $(date +%s) - t0 )) s]: $*"; }
# The seconds a run may take: 600, or what --deadline leaves (empty: too little to start one).
time_left() {
  local limit=600 left
  if [ "$deadline" -gt 0 ]; then
    left=$(( deadline - ($(date +%s) - t0) ))
    [ "$left" -lt 20 ] && return 1
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  echo "$limit"
}

# --- build: ours, llama.cpp (in the background) as bench/e2e.sh does; on the CPU a build
# of llama.cpp without CUDA of its own
llama="$dir/llama.cpp"
if [ "$device" = cuda ]; then llama_sub=b llama_cuda=ON llama_targets=(llama-completion llama-bench)
else llama_sub=b-cpu llama_cuda=OFF llama_targets=(llama-bench) llama_jobs=2; fi
bench_bin="$llama/$llama_sub/bin/llama-bench"
if [ "$use_llama" = yes ]; then
  e2e_build_llama "$llama_sub" "$llama_cuda" "${llama_targets[@]}" > "$out/logs/llama-build-status.log" 2>&1 &
  llama_pid=$!
fi
e2e_build_ours
e2e_model
if [ -n "${llama_pid:-}" ]; then
  # Nothing is measured while it builds (it would take the CPU from the runs); at the
  # --deadline nothing more runs anyway, and a build left going is found by the next call.
  while kill -0 "$llama_pid" 2>/dev/null && time_left > /dev/null; do sleep 5; done
  # Why llama.cpp is missing from the table, for the summary's failures.
  if kill -0 "$llama_pid" 2>/dev/null; then
    echo "still building at the --deadline" > "$out/llama-skipped.txt"
  elif [ ! -x "$bench_bin" ]; then
    for f in llama-build-status llama-build; do
      [ -s "$out/logs/$f.log" ] && tail -3 "$out/logs/$f.log"
    done | tr '\n' ' ' | sed 's/^/the build failed: /' > "$out/llama-skipped.txt"
  fi
  if [ -s "$out/llama-skipped.txt" ]; then use_llama=no; say "llama.cpp skipped: $(cat "$out/llama-skipped.txt")"
  else say "llama.cpp build: ok"; fi
fi

e2e_cap_ram
all_mib=$(python3 -c "print(round($pack_bytes / 2**20 + 64, 1))")
report="$root/bench/ceiling_report.py"
vocab=$(python3 "$report" --vocab "$base.trunk.gguf") || { say "cannot read the vocabulary size of $base.trunk.gguf"; exit 1; }
gpu=""
[ "$device" = cuda ] && gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
# Eager module loading: a fresh process's first launch of each kernel would otherwise load
# it inside the timed prefill (llama-bench has a warm-up run; ours runs each prompt once).
export CUDA_MODULE_LOADING="${CUDA_MODULE_LOADING:-EAGER}"
python3 - "$out/meta.json" <<EOF
import json, sys, os
json.dump({"arch": "$arch", "preset": "$preset", "layers": $layers, "model_bytes": $model_bytes, "pack_bytes": $pack_bytes,
           "cache_mib": $all_mib, "ram_cap_bytes": $cap, "ram_capped": "$capped" == "yes", "ram_ratio": $ram_ratio,
           "contexts": [int(d) for d in "$contexts".split(",")], "tokens": $tokens, "reps": $reps, "vocab": $vocab,
           "device": "$device", "synth_args": "$synth_args", "gpu": "$gpu", "llama": "$use_llama" == "yes",
           "cuda_module_loading": "$CUDA_MODULE_LOADING", "against": " ".join(w for w in ("$against", "$against_args") if w) or None,
           "git": "$(e2e_tree)"}, open(sys.argv[1], "w"), indent=1)
EOF

# --- ours: one process per context length and repetition. Every context runs once, then
# llama-bench, then ours again up to --reps times: a --deadline then leaves both sides
# measured at every context it reached.
: > "$out/runs.jsonl"
evict "$model" "$base.trunk.gguf"
run_ours() {  # REP
  local rep="$1" d ids who
  for d in ${contexts//,/ }; do
    ids=$(python3 "$report" --prompt-ids "$d" "$vocab")
    for who in ${against:+against} ours; do
      run_one "$rep" "$d" "$ids" "$who" || return
    done
  done
}
run_one() {  # REP D IDS ours|against
  local rep="$1" d="$2" ids="$3" who="$4" limit log cmd smi_pid t1 rc bin="$build"
  [ "$who" = against ] && bin="$against"
  limit=$(time_left) || { say "$who: --deadline reached before D=$d (run $rep)"; return 1; }
  log="$out/logs/$who-$d-$rep.log"
  cmd=("$bin/examples/xpack-run" -m "$base.trunk.gguf" --pack "$base.xpack" --device "$device" --cache-mib "$all_mib"
       --preload-experts --greedy --ignore-eos -n "$tokens" --json --prompt-ids "$ids")
  # shellcheck disable=SC2206  # the flags, split as the user wrote them
  [ "$who" = against ] && [ -n "$against_args" ] && cmd+=($against_args)
  smi_pid=""
  if [ "$device" = cuda ] && command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits -lms 200 > "$log.vram" 2>/dev/null &
    smi_pid=$!
  fi
  t1=$(date +%s.%N)
  timeout "$limit" "${cmd[@]}" > "$log.out" 2> "$log" < /dev/null; rc=$?
  [ -n "$smi_pid" ] && { kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null; }
  python3 "$report" --parse-ours "$d" "$rc" "$log.out" "$log" "$t1" "$log.vram" "$rep" "$who" >> "$out/runs.jsonl"
  say "$who D=$d (run $rep): $(python3 "$report" --brief "$out/runs.jsonl")"
}
run_ours 1

# --- llama.cpp: pp D from an empty context, then tg N at each depth D
if [ "$use_llama" = yes ]; then
  for kind in pp tg; do
    limit=$(time_left) || { say "llama.cpp $kind: --deadline reached, skipped"; continue; }
    # The first context twice: llama-bench's first test of a run has come out at a third of
    # its other runs' speed (pp 512: 2088 and 2959 tok/s against 6600-6682; tg at depth 512:
    # 135.6 against 375-395), its own warm-up run notwithstanding; the report keeps a
    # context's last test, so a slow first test stays out. Not the whole story: on
    # 2026-12-04 both pp 512 tests of one run gave 3231 and 3271 (doc/benchmarks.md).
    warm="${contexts%%,*},$contexts"
    if [ "$kind" = pp ]; then args=(-p "$warm" -n 0); else args=(-p 0 -n "$tokens" -d "$warm"); fi
    log="$out/logs/llama-$kind.log"
    timeout "$limit" "$bench_bin" -m "$model" -ngl 99 "${args[@]}" -r "$reps" -o json > "$out/llama-$kind.json" 2> "$log" < /dev/null
    rc=$?
    echo "$rc" > "$out/llama-$kind.rc"
    say "llama.cpp $kind: rc $rc$( [ "$rc" -ne 0 ] && echo ", $(tail -2 "$log" | tr '\n' ' ')")"
  done
else
  say "llama.cpp: not run (--no-llama or no build): the table has ours only"
fi

for rep in $(seq 2 "$reps"); do run_ours "$rep"; done

# --- where a step goes: one profiled run of ours per --profile context (not in the table)
for d in ${profile//,/ }; do
  limit=$(time_left) || { say "profile D=$d: --deadline reached, skipped"; continue; }
  ids=$(python3 "$report" --prompt-ids "$d" "$vocab")
  timeout "$limit" "$build/examples/xpack-run" -m "$base.trunk.gguf" --pack "$base.xpack" --device "$device" \
    --cache-mib "$all_mib" --preload-experts --greedy --ignore-eos -n 16 --json --prompt-ids "$ids" --profile-ops \
    > /dev/null 2> "$out/profile-$d.txt" < /dev/null
  say "profile D=$d: rc $?, OUT/profile-$d.txt; its decode, the first rows:"
  grep -A 14 -- "--profile-ops decode:" "$out/profile-$d.txt" | cut -c1-120
done

python3 "$report" --summary "$out/meta.json" "$out/runs.jsonl" "$out" > "$out/ceiling.json"
tar czf "$out/logs.tar.gz" -C "$out" logs runs.jsonl && rm -rf "$out/logs"
python3 "$report" --table "$out/ceiling.json"
