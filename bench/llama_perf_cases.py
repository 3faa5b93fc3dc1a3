#!/usr/bin/env python3
"""Adds the shapes bench-kernels measures to llama.cpp's test-backend-ops perf list.

test-backend-ops only runs perf cases from its own list, so the MoE expert shapes
(DeepSeek-V4-Flash MXFP4, Kimi-K3 Q2_K/Q3_K) and a matrix several times the 60 MB L2
(16384 inputs x 32768 rows, every type, decode only), at 1, 2, 4 and 8 tokens (the experts
also at 512) are added before its
"qwen3-30b-a3b" cases; and the experts as a layer's grouped product (MUL_MAT_ID: DeepSeek-V4's
top-6 of 256, Kimi-K3's top-16 of 384, at 1 and 8 tokens; and Kimi-K3's at one token from a
pool of 32), which bench-kernels' grouped launches do. Used by bench/llama-kernels.sh and bench/llama-prebuild.sh.

usage: bench/llama_perf_cases.py LLAMA_SOURCE_DIR
"""
import sys
from pathlib import Path

MARKER = '    // qwen3-30b-a3b\n'
BEGIN = '    // libxpack: bench/llama_perf_cases.py\n'
END = '    // end of libxpack\'s cases\n'
EXPERTS = [('MXFP4', 2048, 4096), ('MXFP4', 4096, 2048), ('Q2_K', 3072, 3584), ('Q3_K', 3584, 3072)]
LARGE = ['F32', 'F16', 'BF16', 'Q8_0', 'Q4_K', 'Q5_K', 'Q6_K', 'Q2_K', 'Q3_K', 'MXFP4']
# (experts a layer, chosen a token) of each expert type
ROUTED = {'MXFP4': (256, 6), 'Q2_K': (384, 16), 'Q3_K': (384, 16)}
SMALL_POOL = 32


def cases() -> str:
    add = ''.join(
        '    for (int bs : {1, 2, 4, 8, 512}) {\n'
        f'        test_cases.emplace_back(new test_mul_mat(GGML_TYPE_{t}, GGML_TYPE_F32, {m}, bs, {k}, {{1, 1}}, {{1, 1}}));\n'
        '    }\n' for t, m, k in EXPERTS)
    add += ''.join(
        '    for (int bs : {1, 2, 4, 8}) {\n'
        f'        test_cases.emplace_back(new test_mul_mat(GGML_TYPE_{t}, GGML_TYPE_F32, 32768, bs, 16384, {{1, 1}}, {{1, 1}}));\n'
        '    }\n' for t in LARGE)
    add += ''.join(
        '    for (int bs : {1, 8}) {\n'
        f'        test_cases.emplace_back(new test_mul_mat_id(GGML_TYPE_{t}, GGML_TYPE_F32, {ROUTED[t][0]}, '
        f'{ROUTED[t][1]}, false, {m}, bs, {k}));\n'
        '    }\n' for t, m, k in EXPERTS)
    # Kimi-K3's one-token step from a pool of 32: the same work as from 384 (16 distinct
    # experts, the same ones every repetition), set up in seconds rather than minutes.
    add += ''.join(
        f'    test_cases.emplace_back(new test_mul_mat_id(GGML_TYPE_{t}, GGML_TYPE_F32, {SMALL_POOL}, '
        f'{ROUTED[t][1]}, false, {m}, 1, {k}));\n' for t, m, k in EXPERTS if ROUTED[t][1] == 16)
    return add


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] in ('-h', '--help'):
        print(__doc__.strip(), file=sys.stderr if len(sys.argv) != 2 else sys.stdout)
        return 0 if len(sys.argv) == 2 else 2
    path = Path(sys.argv[1]) / 'tests' / 'test-backend-ops.cpp'
    try:
        text = path.read_text()
    except OSError as e:
        print(f'llama_perf_cases: {path}: {e.strerror}', file=sys.stderr)
        return 1
    add = BEGIN + cases() + END
    if add in text:  # already added (a second run on the same tree)
        return 0
    # An earlier list of ours (the tree kept by llama-prebuild.sh) is replaced, not added to.
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + text[text.index(END) + len(END):]
    if MARKER not in text:
        print(f'llama_perf_cases: {path}: the perf case list changed (no "{MARKER.strip()}"): '
              'cannot add the expert shapes', file=sys.stderr)
        return 1
    path.write_text(text.replace(MARKER, add + MARKER, 1))
    return 0


if __name__ == '__main__':
    sys.exit(main())
