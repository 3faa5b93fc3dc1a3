#!/usr/bin/env python3
"""Independent reference dequantizer for test_dequant: llama.cpp's gguf-py.

usage: dequant_ref.py TYPE_NAME IN.bin OUT.f32
       dequant_ref.py --gguf MODEL.gguf OUT.f32
The first form reads raw ggml blocks of type TYPE_NAME (e.g. Q2_K, MXFP4, F16)
from IN.bin and writes their little-endian float32 decode, as computed by
gguf.quants.dequantize, to OUT.f32. The second decodes every tensor of MODEL.gguf
of a type in DECODED_TYPES, in file order, into OUT.f32 and prints one line per tensor:
"name<TAB>type<TAB>elements". Exit status 3 means the gguf package is missing.
"""
import sys

try:
    import numpy as np
    import gguf
    from gguf.quants import dequantize
except ImportError as e:  # the C++ test turns this into a clear failure message
    print(f"dequant_ref.py: cannot import numpy/gguf ({e}); pip install gguf", file=sys.stderr)
    sys.exit(3)


# What xpack-run decodes beyond plain F32 (I32 is a plain integer cast).
DECODED_TYPES = {"F16", "BF16", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4"}


def decode_model(path: str, dst: str) -> int:
    reader = gguf.GGUFReader(path)
    with open(dst, "wb") as out:
        for t in reader.tensors:
            if t.tensor_type.name not in DECODED_TYPES:
                continue
            values = dequantize(t.data, t.tensor_type).astype("<f4", copy=False).reshape(-1)
            assert values.size == int(t.n_elements), t.name
            values.tofile(out)
            print(f"{t.name}\t{t.tensor_type.name}\t{values.size}")
    return 0


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--gguf":
        return decode_model(sys.argv[2], sys.argv[3])
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
