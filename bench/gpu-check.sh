#!/usr/bin/env bash
# One-shot check for the GPU machine: configure and build with CUDA when
# available, run the whole test suite, then measure reads on this machine's disk
# with bench/compare-fio.sh and xpack-fio (all modes, and --h2d when CUDA is
# built), and print a short summary at the end.
#
# usage: bench/gpu-check.sh [FILE_DIR]   (FILE_DIR: where the test file goes;
#                                         default: the build directory)
# Environment: XPACK_CHECK_SIZE (default 16G: larger than what a buffered run
# reads, so few reads hit the page cache), XPACK_CHECK_RUNTIME (default 10).
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="build-gpu"
size="${XPACK_CHECK_SIZE:-16G}"
runtime="${XPACK_CHECK_RUNTIME:-10}"
log="$(mktemp)"
summary=()

setup() {
  if [ -d "$build" ]; then
    meson setup --reconfigure "$build" "$@" 2>&1 | tail -5
  else
    meson setup "$build" "$@" 2>&1 | tail -5
  fi
  return "${PIPESTATUS[0]}"
}
if ! setup -Dcuda=auto; then
  # A CUDA toolchain that configures badly must not hide the CPU-side results.
  echo "gpu-check: configuring with -Dcuda=auto failed; retrying with -Dcuda=disabled"
  summary+=("WARNING: meson setup -Dcuda=auto failed; built without CUDA")
  rm -rf "$build"
  setup -Dcuda=disabled || { echo "gpu-check: meson setup failed"; exit 1; }
fi
meson compile -C "$build" 2>&1 | tail -20
if [ ! -x "$build/bench/xpack-fio" ]; then
  echo "gpu-check: build failed (no $build/bench/xpack-fio)"; exit 1
fi
cuda="no"
grep -q "XPACK_HAVE_CUDA" "$build/build.ninja" 2>/dev/null && cuda="yes"
summary+=("build: ok (cuda: $cuda)")

meson test -C "$build" --print-errorlogs 2>&1 | tee "$log" | tail -15
summary+=("tests: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$log" | tr -s ' ' | paste -sd ' ')")

if [ "$cuda" = yes ] && [ -x "$build/bench/bench-kernels" ]; then
  # The compute kernels: their test suite, then bench-kernels (and llama.cpp's
  # own CUDA kernels on the same shapes when XPACK_LLAMA_TARBALL names the
  # baseline tarball: bench/llama-kernels.sh builds test-backend-ops, ~3 min).
  echo; echo "== CUDA kernels (suite cuda, bench-kernels)"
  meson test -C "$build" --no-rebuild --suite cuda --print-errorlogs 2>&1 | tee "$log" | tail -5
  summary+=("cuda suite: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$log" | tr -s ' ' | paste -sd ' ')")
  klog="$build/bench-kernels.log"
  llog=()
  if [ -n "${XPACK_LLAMA_TARBALL:-}" ] &&
     bench/llama-kernels.sh "$XPACK_LLAMA_TARBALL" "$build/llama" > "$build/llama-kernels.log" 2>&1; then
    llog=("$build/llama-kernels.log")
  fi
  if "$build/bench/bench-kernels" > "$klog" 2>&1; then
    python3 bench/kernel-table.py "$klog" "${llog[@]}" | tee "$log"
    summary+=("kernels (n=1 decode, cold = weights from HBM; table above):")
    while read -r l; do summary+=("  $l"); done < <(grep -E '^matvec .* 1 (cold|hot)' "$log" | grep -E 'mxfp4|q2_K|q3_K')
  else
    summary+=("bench-kernels FAILED: see $klog")
  fi
fi

dir="${1:-$root/$build}"
file="$dir/xpack-fio-check.bin"
echo; echo "== disk"; df -T "$dir"; uname -r; nproc

echo; echo "== compare-fio (bs 1M qd 32 rand; fio, huge pages, 4K pages, fio)"
bench/compare-fio.sh --build "$build" --file "$file" --size "$size" --bs 1M --qd 32 \
  --pattern rand --runtime "$runtime" 2>&1 | tee "$log"
summary+=("$(grep 'throughput ratio uring-fixed' "$log")")
summary+=("$(grep 'throughput ratio huge pages' "$log")")
summary+=("$(grep 'fio drift' "$log")")
summary+=("$(grep 'CPU s/GB ratio' "$log")")

echo; echo "== xpack-fio all modes (bs 4M qd 16 rand)"
"$build/bench/xpack-fio" --file "$file" --bs 4M --qd 16 --runtime "$runtime" --mode all 2>&1 | tee "$log"
summary+=("all modes 4M/16: $(awk '$1 ~ /^(buffered|pread-direct|uring|uring-fixed|uring-sqpoll)$/ {printf "%s %s GB/s; ", $1, $2}' "$log")")

if [ "$cuda" = yes ]; then
  echo; echo "== xpack-fio --h2d (bs 4M qd 16 rand)"
  "$build/bench/xpack-fio" --file "$file" --bs 4M --qd 16 --runtime "$runtime" --mode uring-fixed --h2d 2>&1 | tee "$log"
  summary+=("uring-fixed +h2d: $(awk '$1=="uring-fixed" {print $2" GB/s"}' "$log")")
fi

echo
echo "== summary ($(date -u +%Y-%m-%dT%H:%MZ), $(uname -r))"
for s in "${summary[@]}"; do echo "  $s"; done
rm -f "$log"
