#!/usr/bin/env bash
# The CUDA and Python suites on the GPU machine in one command, with the oracle models
# that cuda_deepseek4 and cuda_kimi_k3 need (../shared does not travel there).
#
# usage: bench/gpu-suites.sh --fixtures-to DIR [--models LIST]   (here: copy the fixtures into DIR)
#        bench/gpu-suites.sh [--fixtures DIR] [--build DIR] [--prebuilt FILE] [--jobs N] [-- MESON_TEST_ARGS]
#   --fixtures-to DIR: run on this machine; copies the oracle models and logits of LIST
#     from ../shared/oracle into DIR: name DIR (inside the checkout, git-ignored or excluded)
#     in the device tool's carry, with .deps. The carry holds 64 MiB in all: deepseek4's
#     files are about 8 MB, kimi-k3's about 47, so one call may not carry both; beside
#     kimi-k3's, carry a bundle of its tests only (bench/prebuilt.py --test 'cuda_kimi_k3*'
#     --test 'cuda_oracle_kimi*': about 5 MiB).
#   --models LIST: deepseek4, kimi-k3 or both, comma-separated (default both)
#   --fixtures DIR: on the GPU machine, DIR from --fixtures-to: linked as ../shared/oracle
#     (deepseek4) and named in XPACK_KIMI_FIXTURE_DIR (kimi-k3)
#   --build DIR: the CUDA build (default build-gpu; configured with -Dcuda=enabled if new)
#   --prebuilt FILE: the tests' files built on the CPU machine (bench/prebuilt.py BUILD
#     FILE there, carried): unpacked into the configured DIR, nothing is built
#   --jobs N: tests at a time (default 4: the model tests each run xpack-run processes)
#   after --: more arguments for meson test (e.g. a test name)
# Installs .deps (bench/fetch-gpu-deps.sh fills it here) and the Python wheels, builds,
# runs `meson test --suite cuda --suite python`, and prints each suite's result and the
# failures' logs last. CUDA_MODULE_LOADING=EAGER unless set (kernels load at start, not
# inside a timed step).
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 1
fixtures="" build=build-gpu jobs=4 copy_to="" models="deepseek4,kimi-k3" prebuilt=""
need() { [ $# -ge 2 ] || { echo "gpu-suites: $1 needs a value (--help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --fixtures|--fixtures-to|--models|--build|--jobs|--prebuilt) need "$@" ;;&
    --fixtures) fixtures="$2"; shift 2 ;;
    --fixtures-to) copy_to="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --prebuilt) prebuilt="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "gpu-suites: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "gpu-suites: --jobs is a whole number >= 1, got '$jobs'" >&2; exit 2; }
if [ -n "$prebuilt" ]; then
  [ -f "$prebuilt" ] || { echo "gpu-suites: --prebuilt $prebuilt: no such file" >&2; exit 2; }
  prebuilt="$(cd "$(dirname "$prebuilt")" && pwd)/$(basename "$prebuilt")"
fi

if [ -n "$copy_to" ]; then
  src="$root/../shared/oracle"
  [ -d "$src/models" ] || { echo "gpu-suites: $src not found (the fixtures come from ../shared)" >&2; exit 1; }
  mkdir -p "$copy_to/models" "$copy_to/logits" || exit 1
  IFS=, read -ra names <<< "$models"
  for m in "${names[@]}"; do
    case "$m" in
      deepseek4|kimi-k3) cp "$src/models/$m"-*.gguf "$copy_to/models/" && cp "$src/logits/$m"-* "$copy_to/logits/" || exit 1 ;;
      *) echo "gpu-suites: --models takes deepseek4 and kimi-k3, got '$m'" >&2; exit 2 ;;
    esac
  done
  echo "gpu-suites: fixtures in $copy_to ($(du -sh "$copy_to" | cut -f1)); carry it with .deps"
  exit 0
fi

t0=$(date +%s)
say() { echo "gpu-suites [$(( $(date +%s) - t0 )) s]: $*"; }
[ -f .deps/install-debs.sh ] || { echo "gpu-suites: no .deps (run bench/fetch-gpu-deps.sh here and carry .deps)" >&2; exit 1; }
sh .deps/install-debs.sh > /tmp/gpu-suites-debs.log 2>&1 || { tail -5 /tmp/gpu-suites-debs.log; exit 1; }
if ls .deps/wheels/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/gpu-suites-site .deps/wheels/*.whl > /dev/null 2>&1 &&
    export PYTHONPATH="/tmp/gpu-suites-site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -n "$fixtures" ]; then
  fixtures="$(cd "$fixtures" && pwd)" || exit 1
  if [ ! -e ../shared/oracle ]; then mkdir -p ../shared && ln -sfn "$fixtures" ../shared/oracle; fi
  export XPACK_KIMI_FIXTURE_DIR="$fixtures"
fi
export CUDA_MODULE_LOADING="${CUDA_MODULE_LOADING:-EAGER}"
log="$build/gpu-suites"
mkdir -p "$log"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dcuda=enabled > "$log/meson.log" 2>&1 || { tail -20 "$log/meson.log"; exit 1; }
fi
if [ -n "$prebuilt" ]; then
  # Built on the CPU machine: its files in this configured build, its libraries first.
  tar xJf "$prebuilt" -C "$build" || { echo "gpu-suites: cannot unpack $prebuilt" >&2; exit 1; }
  export LD_LIBRARY_PATH="$(cd "$build" && pwd)/prebuilt-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  missing=$(tar tJf "$prebuilt" | while read -r f; do
    [ -f "$build/$f" ] && [ -x "$build/$f" ] && ldd "$build/$f" 2>/dev/null | grep "not found"; done | sort -u)
  [ -z "$missing" ] || { echo "gpu-suites: the prebuilt files cannot load: $missing" >&2; exit 1; }
  say "unpacked $(basename "$prebuilt") (built elsewhere: $(sed -n 's/^tests: //p' "$build/prebuilt-lib/PREBUILT.txt" | wc -w) tests)"
else
  ninja -C "$build" > "$log/ninja.log" 2>&1 || { grep -B2 -A20 -m3 "FAILED" "$log/ninja.log"; exit 1; }
  say "built"
fi
meson test -C "$build" --no-rebuild --suite cuda --suite python --num-processes "$jobs" --print-errorlogs "$@" \
  > "$log/test.log" 2>&1
rc=$?
say "tests done (meson test exit $rc)"
grep -E "^ *[0-9]+/[0-9]+ " "$log/test.log"
grep -E "^(Ok|Fail|Skipped|Timeout):" "$log/test.log" | tr -s ' ' | paste -sd ' '
# Every failure's own lines: doctest's file:line ERROR / CHECK lines and the first of the rest.
if [ $rc -ne 0 ]; then grep -E "ERROR|FAILED|CHECK|REQUIRE|Traceback|Error" "$log/test.log" | head -60; fi
exit $rc
