#!/usr/bin/env bash
# Builds llama.cpp's test-backend-ops (CUDA, sm_90, flash attention off: it is
# not measured and is most of the build) from the baseline tarball, with the
# MoE expert shapes and a matrix several times the L2 added to its perf cases
# (bench/llama_perf_cases.py: it only runs cases from its list), and prints its
# MUL_MAT timings for the types and shapes bench-kernels measures. TARBALL may
# also be bench/llama-prebuild.sh's bundle (built on the CPU machine, the same
# perf cases): it is unpacked in WORKDIR and nothing is built.
#
# usage: bench/llama-kernels.sh [--graphs] TARBALL WORKDIR [JOBS]    (GPU machine; ~3 min of 12 cores)
#   --graphs: test-backend-ops with its CUDA graphs on (each product replayed, as
#   bench-kernels --graph replays ours); by default off (GGML_CUDA_DISABLE_GRAPHS=1:
#   launched one by one from the host, as bench-kernels by default). On, its run took
#   more than 150 s on an H100 (2026-12-06).
set -euo pipefail
graphs=0
if [ "${1:-}" = --graphs ]; then graphs=1; shift; fi
[ $# -ge 2 ] || { echo "usage: bench/llama-kernels.sh [--graphs] TARBALL WORKDIR [JOBS]" >&2; exit 2; }
tarball="$1"; work="$2"; jobs="${3:-12}"
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$work"
if tar tf "$tarball" 2>/dev/null | grep -x 'b/bin/test-backend-ops' > /dev/null; then
  tar xf "$tarball" -C "$work"
  bin="$work/b/bin/test-backend-ops"
  if ldd "$bin" | grep 'not found'; then echo "llama-kernels: $bin cannot load the libraries above" >&2; exit 1; fi
else
  tar xzf "$tarball" -C "$work"
  cd "$work/llama.cpp"
  python3 "$root/bench/llama_perf_cases.py" .
  cmake -B b -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DGGML_CUDA_FA=OFF \
    -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_SERVER=OFF > cmake.log 2>&1 || { tail -30 cmake.log; exit 1; }
  cmake --build b -j"$jobs" --target test-backend-ops > build.log 2>&1 || { tail -30 build.log; exit 1; }
  bin="$PWD/b/bin/test-backend-ops"
fi
if [ $graphs = 0 ]; then export GGML_CUDA_DISABLE_GRAPHS=1; fi
"$bin" perf -o MUL_MAT -b CUDA0 \
  -p 'type_a=(f32|f16|bf16|q8_0|q4_K|q5_K|q6_K|q2_K|q3_K|mxfp4),type_b=f32,m=(4096|2048|3072|3584|32768),n=(1|2|4|8|512),k=(14336|4096|2048|3584|3072|16384),bs=\[1,1\],nr=\[1,1\],'
# Kimi-K3's experts at one token from a pool of 32 (llama_perf_cases.py): the same 16
# experts' work as from its 384, set up in seconds, so it comes first.
"$bin" perf -o MUL_MAT_ID -b CUDA0 \
  -p 'type_a=(q2_K|q3_K),type_b=f32,n_mats=32,n_used=16,b=0,m=(3072|3584),n=1,k=(3584|3072)$'
# The experts as one grouped product of a layer (llama_perf_cases.py's MUL_MAT_ID cases:
# a bundle made before 2026-12-06 has none, and this prints no timing). Slow to set up:
# test-backend-ops fills every expert of a case with random quantized data on the CPU,
# about a minute for each of DeepSeek-V4's MXFP4 cases (256 experts) on an H100 machine,
# more for Kimi-K3's 384 (the four MXFP4 cases and none of the others fit in 350 s).
"$bin" perf -o MUL_MAT_ID -b CUDA0 \
  -p 'type_a=(q2_K|q3_K|mxfp4),type_b=f32,n_mats=(256|384),n_used=(6|16),b=0,m=(4096|2048|3072|3584),n=(1|8),k=(4096|2048|3584|3072)$'
