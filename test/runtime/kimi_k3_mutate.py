#!/usr/bin/env python3
"""Writes a damaged copy of a kimi-k3 GGUF for the model's bad-input tests.

Exactly one change per run: drop a tensor, drop a metadata key, set an integer
key to another value, or cut a tensor to its first N elements along ne0 (a wrong
shape). Everything else is copied unchanged with gguf-py.
"""
import argparse

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from gguf_finish import finish  # this script's folder is on sys.path


def field_value(field):
    vtype = GGUFValueType(field.types[0])
    if vtype == GGUFValueType.ARRAY:
        sub = GGUFValueType(field.types[1])
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data], vtype, sub
        return [field.parts[i].tolist()[0] for i in field.data], vtype, sub
    if vtype == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8"), vtype, None
    return field.parts[field.data[0]].tolist()[0], vtype, None


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("src")
    ap.add_argument("out")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--drop-tensor")
    g.add_argument("--drop-key")
    g.add_argument("--set-int", metavar="KEY=VALUE")
    g.add_argument("--cut-tensor", metavar="NAME=N")
    args = ap.parse_args()

    reader = GGUFReader(args.src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode("utf-8")
    writer = GGUFWriter(args.out, arch)
    set_key, set_val = (args.set_int.split("=") + [None])[:2] if args.set_int else (None, None)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name == args.drop_key:
            continue
        val, vtype, sub = field_value(field)
        if name == set_key:
            val = int(set_val)
        writer.add_key_value(name, val, vtype, sub)

    cut_name, cut_n = (args.cut_tensor.split("=") + [None])[:2] if args.cut_tensor else (None, None)
    for t in reader.tensors:
        if t.name == args.drop_tensor:
            continue
        data = np.array(t.data)
        if t.name == cut_name:
            data = np.ascontiguousarray(data[..., : int(cut_n)])
        writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)

    finish(writer)


if __name__ == "__main__":
    main()
