#!/usr/bin/env bash
# Builds llama.cpp's test-backend-ops (CUDA, sm_90, flash attention off: it is
# not measured and is most of the build) from the baseline tarball, with the
# MoE expert shapes and a matrix several times the L2 added to its perf cases (it
# only runs cases from its list),
# and prints its MUL_MAT timings for the types and shapes bench-kernels measures.
#
# usage: bench/llama-kernels.sh TARBALL WORKDIR [JOBS]    (GPU machine; ~3 min of 12 cores)
set -euo pipefail
tarball="$1"; work="$2"; jobs="${3:-12}"
mkdir -p "$work"
tar xzf "$tarball" -C "$work"
cd "$work/llama.cpp"
python3 - <<'PY'
p = 'tests/test-backend-ops.cpp'
s = open(p).read()
marker = '    // qwen3-30b-a3b\n'
assert marker in s, 'perf case list changed: cannot add the expert shapes'
add = ''.join(
    '    for (int bs : {1, 8, 512}) {\n'
    f'        test_cases.emplace_back(new test_mul_mat(GGML_TYPE_{t}, GGML_TYPE_F32, {m}, bs, {k}, {{1, 1}}, {{1, 1}}));\n'
    '    }\n'
    for t, m, k in [('MXFP4', 2048, 4096), ('MXFP4', 4096, 2048), ('Q2_K', 3072, 3584), ('Q3_K', 3584, 3072)])
# bench-kernels' matrix several times the L2 (16384 inputs x 32768 rows), every type, decode only.
add += ''.join(
    '    for (int bs : {1, 8}) {\n'
    f'        test_cases.emplace_back(new test_mul_mat(GGML_TYPE_{t}, GGML_TYPE_F32, 32768, bs, 16384, {{1, 1}}, {{1, 1}}));\n'
    '    }\n'
    for t in ['F32', 'F16', 'BF16', 'Q8_0', 'Q4_K', 'Q5_K', 'Q6_K', 'Q2_K', 'Q3_K', 'MXFP4'])
s = s.replace(marker, add + marker, 1)
open(p, 'w').write(s)
PY
cmake -B b -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DGGML_CUDA_FA=OFF \
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_SERVER=OFF > cmake.log 2>&1 || { tail -30 cmake.log; exit 1; }
cmake --build b -j"$jobs" --target test-backend-ops > build.log 2>&1 || { tail -30 build.log; exit 1; }
GGML_CUDA_DISABLE_GRAPHS=1 ./b/bin/test-backend-ops perf -o MUL_MAT -b CUDA0 \
  -p 'type_a=(f32|f16|bf16|q8_0|q4_K|q5_K|q6_K|q2_K|q3_K|mxfp4),type_b=f32,m=(4096|2048|3072|3584|32768),n=(1|8|512),k=(14336|4096|2048|3584|3072|16384),bs=\[1,1\],nr=\[1,1\],'
