#!/usr/bin/env python3
"""Writes a GGUF with every quantized tensor decoded to F32 (gguf-py's decoders).

usage: gguf_dequantize.py IN.gguf OUT.gguf

The result holds the exact values the quantized weights stand for, as
`llama-quantize --allow-requantize IN OUT F32` writes them (how ../shared/oracle made
its `-deq` references): llama.cpp then multiplies them in f32 instead of first
rounding the activations to Q8_0/Q8_K, so its logits are the exact-arithmetic
reference for a runtime that keeps activations in fp32 (test/runtime/synth_llama.py).
Metadata is copied; general.file_type becomes 0 (all F32) and
general.quantization_version is dropped, as llama-quantize does for F32.
Exit status 3: numpy or gguf (pip install gguf) is missing.
"""
import os
import sys

try:
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize
except ImportError as e:
    print(f"gguf_dequantize.py: cannot import numpy/gguf ({e}); pip install gguf", file=sys.stderr)
    sys.exit(3)

from gguf_finish import finish  # this script's folder is on sys.path
from kimi_k3_mutate import field_value

KEPT = {GGMLQuantizationType.F32, GGMLQuantizationType.I32}


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, out = sys.argv[1:]
    reader = GGUFReader(src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode("utf-8")
    # Written beside OUT and renamed at the end: a failure leaves no partial model.
    part = out + ".part"
    try:
        decoded = write(reader, arch, part)
        os.replace(part, out)
    except BaseException:
        if os.path.exists(part):
            os.remove(part)
        raise
    print(f"{out}: {decoded} tensors decoded to F32, {len(reader.tensors) - decoded} copied")
    return 0


def write(reader, arch, out):
    writer = GGUFWriter(out, arch)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.quantization_version"):
            continue
        val, vtype, sub = field_value(f)
        if name == "general.file_type":
            val, vtype = 0, GGUFValueType.UINT32
        writer.add_key_value(name, val, vtype, sub)
    decoded = 0
    for t in reader.tensors:
        qtype = GGMLQuantizationType(t.tensor_type)
        if qtype in KEPT:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=qtype)
            continue
        # ne {a, b, c} is an array of shape (c, b, a); dequantize gives that shape.
        shape = tuple(int(n) for n in reversed(t.shape))
        values = dequantize(np.array(t.data), qtype).astype(np.float32).reshape(shape)
        writer.add_tensor(t.name, values, raw_dtype=GGMLQuantizationType.F32)
        decoded += 1
    finish(writer)
    return decoded


if __name__ == "__main__":
    sys.exit(main())
