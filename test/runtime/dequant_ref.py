#!/usr/bin/env python3
"""Independent reference dequantizer for test_dequant: llama.cpp's gguf-py.

usage: dequant_ref.py TYPE_NAME IN.bin OUT.f32
Reads raw ggml blocks of type TYPE_NAME (e.g. Q2_K, MXFP4, F16) from IN.bin and
writes their little-endian float32 decode, as computed by gguf.quants.dequantize,
to OUT.f32. Exit status 3 means the gguf package is missing.
"""
import sys

try:
    import numpy as np
    import gguf
    from gguf.quants import dequantize
except ImportError as e:  # the C++ test turns this into a clear failure message
    print(f"dequant_ref.py: cannot import numpy/gguf ({e}); pip install gguf", file=sys.stderr)
    sys.exit(3)


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    name, src, dst = sys.argv[1:]
    qtype = gguf.GGMLQuantizationType[name]
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.fromfile(src, dtype=np.uint8)
    if raw.size % block_bytes != 0:
        print(f"dequant_ref.py: {raw.size} bytes is not a whole number of {name} blocks",
              file=sys.stderr)
        return 2
    out = dequantize(raw, qtype).astype(np.float32, copy=False).reshape(-1)
    assert out.size == raw.size // block_bytes * block_elems
    out.astype("<f4").tofile(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
