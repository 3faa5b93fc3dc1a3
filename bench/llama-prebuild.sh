#!/usr/bin/env bash
# Builds the llama.cpp baseline for the GPU machine here, on the CPU machine (nvcc compiles
# sm_90 without a GPU), into one bundle to carry there, so that a device call spends none
# of its time on llama.cpp's build (about 380 s of 12 cores for llama-bench, 180 s for
# test-backend-ops: most of a 600-s call).
#
# usage: bench/llama-prebuild.sh SOURCE_TARBALL BUNDLE [--work DIR] [--jobs N]
#   SOURCE_TARBALL: the baseline's sources (../shared/baselines' llama.cpp tarball)
#   BUNDLE: the file written (tar.xz): b/bin/ with llama-bench, llama-completion and
#     test-backend-ops (with bench/llama_perf_cases.py's shapes) and their shared libraries,
#     found through RUNPATH $ORIGIN, and b/PREBUILT.txt (the sources' sha256 and the flags)
#   --work DIR: where to unpack and build (default /tmp/llama-prebuild); a second run
#     there rebuilds only what changed
#   --jobs N: build jobs (default: the cores)
# bench/ceiling.sh and bench/e2e.sh take the bundle as --llama-tarball, bench/llama-kernels.sh
# as its TARBALL: each unpacks it instead of building. The flags are bench/e2e-setup.sh's
# (CUDA for sm_90, Release) except: GGML_NATIVE=OFF (the CPU part for AVX2, not for this
# machine's CPU, which the GPU machine's may lack), GGML_CUDA_NCCL=OFF (the GPU machine has
# no system NCCL; one GPU does not use it), and the executables linked with
# --allow-shlib-undefined because this machine has no libcuda.so.1 (the driver's, found
# there at run time). The CUDA kernels are the same source and the same nvcc (13.0).
set -euo pipefail

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
[ "${1:-}" = -h ] || [ "${1:-}" = --help ] && { usage; exit 0; }
[ $# -ge 2 ] || { usage >&2; exit 2; }
src="$1" bundle="$2" work=/tmp/llama-prebuild jobs=$(nproc)
shift 2
while [ $# -gt 0 ]; do
  case "$1" in
    --work) work="${2:?--work needs a directory}"; shift 2 ;;
    --jobs) jobs="${2:?--jobs needs a number}"; shift 2 ;;
    *) echo "llama-prebuild: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
[ -f "$src" ] || { echo "llama-prebuild: $src: no such file" >&2; exit 2; }
case "$jobs" in ''|*[!0-9]*|0) echo "llama-prebuild: --jobs: a whole number from 1 (got '$jobs')" >&2; exit 2 ;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
bundle="$(cd "$(dirname "$bundle")" && pwd)/$(basename "$bundle")"
export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc > /dev/null || { echo "llama-prebuild: no nvcc (CUDA toolkit in /usr/local/cuda)" >&2; exit 1; }

mkdir -p "$work"
sum=$(sha256sum "$src" | cut -d' ' -f1)
# Unpacked again only for other sources, so a second run keeps the build.
if [ "$(cat "$work/source.sha256" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$work/llama.cpp" && tar xzf "$src" -C "$work" && echo "$sum" > "$work/source.sha256"
fi
llama="$work/llama.cpp"
[ -f "$llama/CMakeLists.txt" ] || { echo "llama-prebuild: $src has no llama.cpp/CMakeLists.txt" >&2; exit 1; }
python3 "$root/bench/llama_perf_cases.py" "$llama"

# e2e's flags, later ones winning: test-backend-ops too, and what a build off the GPU machine needs.
# shellcheck source=bench/e2e-setup.sh
. "$root/bench/e2e-setup.sh"
flags=("${e2e_llama_cuda_flags[@]}" -DLLAMA_BUILD_TESTS=ON -DGGML_NATIVE=OFF -DGGML_CUDA_NCCL=OFF
  -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DCMAKE_BUILD_RPATH=/usr/local/cuda/lib64
  "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined")
echo "llama-prebuild: configuring in $llama/b"
cmake -S "$llama" -B "$llama/b" -G Ninja "${flags[@]}" > "$work/cmake.log" 2>&1 ||
  { tail -30 "$work/cmake.log"; exit 1; }
echo "llama-prebuild: building with $jobs jobs (about 25 min of 2 cores from scratch; log $work/build.log)"
cmake --build "$llama/b" -j"$jobs" --target llama-bench llama-completion test-backend-ops > "$work/build.log" 2>&1 ||
  { tail -30 "$work/build.log"; exit 1; }
if ldd "$llama/b/bin/llama-bench" | grep 'not found' | grep -v 'libcuda\.so\.1'; then
  echo "llama-prebuild: llama-bench needs libraries besides the driver's that are not found (above)" >&2; exit 1
fi
{
  echo "llama.cpp prebuilt by bench/llama-prebuild.sh on $(date -u +%F) ($(uname -m), nvcc $(nvcc --version | grep -o 'release [0-9.]*'))"
  echo "source: $(basename "$src") sha256 $sum"
  echo "flags: ${flags[*]}"
  echo "test-backend-ops: perf cases of bench/llama_perf_cases.py added"
} > "$llama/b/PREBUILT.txt"
tar cJf "$bundle.tmp" -C "$llama" b/PREBUILT.txt b/bin && mv "$bundle.tmp" "$bundle"
echo "llama-prebuild: $bundle ($(du -h "$bundle" | cut -f1))"
