#!/usr/bin/env python3
"""Writes a kimi-k3 GGUF whose MLA layers carry the unabsorbed attn_kv_b.

From a model with the absorbed pair (the oracle's kimi-k3-f32.gguf) it writes
the same model with, per MLA layer, one blk.N.attn_kv_b.weight in place of
blk.N.attn_k_b.weight and blk.N.attn_v_b.weight; everything else is copied
unchanged with gguf-py, as kimi_k3_mutate.py copies.

The layout is the one llama.cpp reads (src/models/kimi-k3.cpp at 13f76e69):
the loader creates wkv_b with ne {kv_lora_rank, n_head * (qk_nope + head_v)},
the graph computes kv = wkv_b x c (c the normed latent, [kv_lora_rank]) and
views per head h the rows [h*(qk_nope+head_v), +qk_nope) as k_nope and the
next head_v rows as V. In numpy terms (a tensor of ne {a, b, c} is an array of
shape (c, b, a)):

  attn_k_b  ne {qk_nope, kv_lora, H}  ->  Kb[h, c, d]
  attn_v_b  ne {kv_lora, head_v, H}   ->  Vb[h, e, c]
  attn_kv_b ne {kv_lora, H*(qk_nope+head_v)}  ->  W[r, c], with
      W[h*(qk_nope+head_v) + d,           c] = Kb[h, c, d]   (d < qk_nope)
      W[h*(qk_nope+head_v) + qk_nope + e, c] = Vb[h, e, c]   (e < head_v)

so that k_nope[h, d] = sum_c Kb[h, c, d] c[c]: the absorbed score
(Kb^T q_nope) . c equals q_nope . k_nope, and Vb (softmax c) equals
softmax-weighted V. The same arithmetic, nothing rounded: F32 copied.

--form says which metadata goes with the tensor:

  mla   (default) the absorbed model's keys unchanged: key_length_mla,
        value_length_mla, head_count_kv 1 on MLA layers. The form xpack-run reads.
  mha   llama.cpp's "MLA KV cache disabled" form, the only one in which that
        fork builds its attn_kv_b graph: key_length_mla = value_length_mla = 0
        (hparams.is_mla() false: a per-head K/V cache), key_length = qk_nope +
        qk_rope, value_length = head_v, head_count_kv = head_count on MLA layers.
        (With the mla keys, kimi-k3.cpp takes the wkv_b branch with a null
        inp_attn_kv and the fork crashes.)

--llama-q-order (with --form mha) also reorders every head's query rows of
attn_q_b (or attn_q) from [q_nope | q_rope] to [q_rope | q_nope]. llama.cpp's
attn_kv_b graph builds K = concat(k_rope, k_nope) while Q keeps
[q_nope | q_rope], so without this its scores pair q_nope with k_rope; with it
the dot product is q_rope.k_rope + q_nope.k_nope, the model's. The reorder
touches only the query weights, never attn_kv_b.
"""
import argparse

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from gguf_finish import finish
from kimi_k3_mutate import field_value  # the same metadata copy (this script's folder is on sys.path)


def kv_b_from_absorbed(k_b, v_b):
    """k_b: (H, kv_lora, qk_nope), v_b: (H, head_v, kv_lora) -> (H*(qk_nope+head_v), kv_lora)."""
    if k_b.shape[0] != v_b.shape[0] or k_b.shape[1] != v_b.shape[2]:
        raise SystemExit(f"attn_k_b {k_b.shape} and attn_v_b {v_b.shape} do not agree")
    return np.ascontiguousarray(np.concatenate([np.concatenate([k_b[h].T, v_b[h]], axis=0)
                                                for h in range(k_b.shape[0])], axis=0))


def is_mla_query(name, tensors):
    """attn_q_b, or an attn_q in a block with attn_kv_a_mqa (KDA layers have an attn_q too)."""
    if name.endswith("attn_q_b.weight"):
        return True
    return name.endswith("attn_q.weight") and name.replace("attn_q.weight", "attn_kv_a_mqa.weight") in tensors


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="a kimi-k3 GGUF with attn_k_b/attn_v_b (F32)")
    ap.add_argument("out")
    ap.add_argument("--form", choices=["mla", "mha"], default="mla")
    ap.add_argument("--llama-q-order", action="store_true")
    args = ap.parse_args()
    if args.llama_q_order and args.form != "mha":
        ap.error("--llama-q-order only makes sense with --form mha")

    reader = GGUFReader(args.src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode("utf-8")
    if arch != "kimi-k3":
        raise SystemExit(f"{args.src}: architecture {arch}, expected kimi-k3")
    fields = {name: field_value(f) for name, f in reader.fields.items()}
    get = lambda key: fields[f"{arch}.{key}"][0]
    n_head = get("attention.head_count")
    n_head = n_head[0] if isinstance(n_head, list) else n_head
    hk, hv, rope = get("attention.key_length_mla"), get("attention.value_length_mla"), get("rope.dimension_count")
    nope = hk - rope

    tensors = {t.name: t for t in reader.tensors}
    for t in reader.tensors:
        if t.name.endswith("attn_k_b.weight") and t.tensor_type != 0:  # GGMLQuantizationType.F32
            raise SystemExit(f"{t.name}: type {t.tensor_type}, only F32 sources are supported")

    writer = GGUFWriter(args.out, arch)
    set_keys = {}
    if args.form == "mha":
        set_keys = {
            f"{arch}.attention.key_length_mla": (0, GGUFValueType.UINT32, None),
            f"{arch}.attention.value_length_mla": (0, GGUFValueType.UINT32, None),
            f"{arch}.attention.key_length": (hk, GGUFValueType.UINT32, None),
            f"{arch}.attention.value_length": (hv, GGUFValueType.UINT32, None),
        }
    for name, (val, vtype, sub) in fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name in set_keys:
            val, vtype, sub = set_keys.pop(name)
        elif args.form == "mha" and name == f"{arch}.attention.head_count_kv":
            val = [n_head if v != 0 else 0 for v in val]
        writer.add_key_value(name, val, vtype, sub)
    for name, (val, vtype, sub) in set_keys.items():
        writer.add_key_value(name, val, vtype, sub)

    n_kv_b = 0
    for t in reader.tensors:
        if t.name.endswith("attn_v_b.weight"):
            continue
        data = np.array(t.data)
        name = t.name
        if t.name.endswith("attn_k_b.weight"):
            v_name = t.name.replace("attn_k_b", "attn_v_b")
            data = kv_b_from_absorbed(data, np.array(tensors[v_name].data))
            if data.shape != (n_head * (nope + hv), data.shape[1]):
                raise SystemExit(f"{t.name}: heads and dims do not match the metadata")
            name = t.name.replace("attn_k_b", "attn_kv_b")
            n_kv_b += 1
        elif args.llama_q_order and is_mla_query(t.name, tensors):
            rows = data.reshape(n_head, hk, -1)
            data = np.ascontiguousarray(np.concatenate([rows[:, nope:], rows[:, :nope]], axis=1).reshape(data.shape))
        writer.add_tensor(name, data, raw_dtype=t.tensor_type)
    if n_kv_b == 0:
        raise SystemExit(f"{args.src}: no attn_k_b tensor to convert")

    finish(writer)


if __name__ == "__main__":
    main()
