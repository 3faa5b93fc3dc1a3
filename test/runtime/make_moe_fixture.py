#!/usr/bin/env python3
"""Writes a real-weights MoE fixture from stories260K.gguf (test-models.md, section 3).

Each dense SwiGLU FFN (n_ff = 172) is split along its hidden dimension into 4
experts of 43 units, each zero-padded to 64, in llama.cpp's Mixtral form
(arch llama, ffn_gate_inp + ffn_{gate,up,down}_exps). With the default zero
router every expert gets 1/4, so ffn_down_exps is scaled by 4 (exact) and the
model computes the same function as the dense one up to summation order.

--router random (with --used < 4) makes a deterministic non-zero router for
top-k tests; such a model no longer equals the dense one.
"""
import argparse
import sys

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType, GGMLQuantizationType

from gguf_finish import finish  # this script's folder is on sys.path

N_EXPERTS = 4
N_FF_EXP = 64


def copy_metadata(reader, writer, skip):
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in skip:
            continue
        vtype = GGUFValueType(field.types[0])
        if vtype == GGUFValueType.ARRAY:
            sub = GGUFValueType(field.types[1])
            if sub == GGUFValueType.STRING:
                val = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                val = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_key_value(name, val, vtype, sub)
        elif vtype == GGUFValueType.STRING:
            writer.add_key_value(name, bytes(field.parts[field.data[0]]).decode("utf-8"), vtype)
        else:
            writer.add_key_value(name, field.parts[field.data[0]].tolist()[0], vtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("src", help="stories260K.gguf")
    ap.add_argument("out", help="output GGUF (with --split: the name prefix is derived from it)")
    ap.add_argument("--used", type=int, default=N_EXPERTS, help="expert_used_count (top-k)")
    ap.add_argument("--router", choices=["zero", "random"], default="zero")
    ap.add_argument("--split-max-tensors", type=int, default=0, help="write a gguf-split set")
    ap.add_argument("--fused", action="store_true",
                    help="write gate and up as one ffn_gate_up_exps tensor (gate rows first)")
    args = ap.parse_args()
    if args.router == "zero" and args.used != N_EXPERTS:
        sys.exit("a zero router with top-k < 4 makes expert selection arbitrary (ties); use --router random")

    reader = GGUFReader(args.src)
    tensors = {t.name: np.array(t.data) for t in reader.tensors}
    n_layer = int(reader.fields["llama.block_count"].parts[-1][0])
    n_ff = tensors["blk.0.ffn_gate.weight"].shape[0]
    n_embd = tensors["blk.0.ffn_gate.weight"].shape[1]
    part = n_ff // N_EXPERTS
    assert part * N_EXPERTS == n_ff and part <= N_FF_EXP

    writer = GGUFWriter(args.out, "llama", split_max_tensors=args.split_max_tensors)
    copy_metadata(reader, writer, skip={"general.architecture"})
    writer.add_key_value("llama.expert_count", N_EXPERTS, GGUFValueType.UINT32)
    writer.add_key_value("llama.expert_used_count", args.used, GGUFValueType.UINT32)

    rng = np.random.default_rng(1234)
    scale = 4.0 if args.router == "zero" else 1.0
    for t in reader.tensors:
        name = t.name
        if ".ffn_gate.weight" in name or ".ffn_up.weight" in name or ".ffn_down.weight" in name:
            continue
        writer.add_tensor(name, tensors[name])
        if name.endswith(".ffn_norm.weight"):
            blk = name[: -len("ffn_norm.weight")]
            gate, up, down = (tensors[blk + k] for k in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"))
            # numpy shapes are ne reversed: [expert][out][in].
            g = np.zeros((N_EXPERTS, N_FF_EXP, n_embd), np.float32)
            u = np.zeros_like(g)
            d = np.zeros((N_EXPERTS, n_embd, N_FF_EXP), np.float32)
            for e in range(N_EXPERTS):
                rows = slice(part * e, part * (e + 1))
                g[e, :part] = gate[rows]
                u[e, :part] = up[rows]
                d[e, :, :part] = down[:, rows] * np.float32(scale)
            if args.router == "zero":
                router = np.zeros((N_EXPERTS, n_embd), np.float32)
            else:
                router = rng.standard_normal((N_EXPERTS, n_embd)).astype(np.float32)
            writer.add_tensor(blk + "ffn_gate_inp.weight", router)
            if args.fused:
                writer.add_tensor(blk + "ffn_gate_up_exps.weight", np.concatenate([g, u], axis=1))
            else:
                writer.add_tensor(blk + "ffn_gate_exps.weight", g)
                writer.add_tensor(blk + "ffn_up_exps.weight", u)
            writer.add_tensor(blk + "ffn_down_exps.weight", d)
    assert n_layer == sum(1 for t in reader.tensors if t.name.endswith(".ffn_norm.weight"))

    finish(writer)


if __name__ == "__main__":
    main()
