#!/usr/bin/env python3
"""Independent float64 reference forward pass of a llama GGUF (dense, or
llama.cpp's Mixtral MoE form), written from the model card with numpy and
gguf-py: logits for every position of a token sequence, as raw float32 rows.

Used to check xpack-run's MoE routing with top-k < n_expert, where the
dense model is no reference (test-models.md section 3, step 5).
"""
import argparse
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.parts[f.data[0]].tolist()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model")
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True, help="raw float32 logits [n_ids, n_vocab]")
    args = ap.parse_args()

    r = GGUFReader(args.model)
    W = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in r.tensors}
    n_embd = field(r, "llama.embedding_length")
    n_layer = field(r, "llama.block_count")
    n_head = field(r, "llama.attention.head_count")
    n_head_kv = field(r, "llama.attention.head_count_kv", n_head)
    eps = field(r, "llama.attention.layer_norm_rms_epsilon")
    head_dim = n_embd // n_head
    n_rot = field(r, "llama.rope.dimension_count", head_dim)
    base = field(r, "llama.rope.freq_base", 10000.0)
    top_k = field(r, "llama.expert_used_count", 0)

    ids = [int(x) for x in args.ids.split(",")]
    n = len(ids)
    x = W["token_embd.weight"].reshape(-1, n_embd)[ids]  # [n, n_embd]

    def rmsnorm(v, w):
        return v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + eps) * w

    pos = np.arange(n, dtype=np.float64)
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    ang = pos[:, None] * inv[None, :]  # [n, n_rot/2]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(v):  # v: [n, heads, head_dim]; adjacent pairs rotate
        v = v.copy()
        a, b = v[:, :, 0:n_rot:2].copy(), v[:, :, 1:n_rot:2].copy()
        v[:, :, 0:n_rot:2] = a * cos[:, None, :] - b * sin[:, None, :]
        v[:, :, 1:n_rot:2] = a * sin[:, None, :] + b * cos[:, None, :]
        return v

    min_margin = np.inf
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for il in range(n_layer):
        p = f"blk.{il}."
        h = rmsnorm(x, W[p + "attn_norm.weight"])
        q = rope((h @ W[p + "attn_q.weight"].T).reshape(n, n_head, head_dim))
        k = rope((h @ W[p + "attn_k.weight"].T).reshape(n, n_head_kv, head_dim))
        v = (h @ W[p + "attn_v.weight"].T).reshape(n, n_head_kv, head_dim)
        group = n_head // n_head_kv
        out = np.zeros((n, n_head, head_dim))
        for hh in range(n_head):
            s = q[:, hh, :] @ k[:, hh // group, :].T / np.sqrt(head_dim) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            out[:, hh, :] = s @ v[:, hh // group, :]
        x = x + out.reshape(n, -1) @ W[p + "attn_output.weight"].T

        h = rmsnorm(x, W[p + "ffn_norm.weight"])
        silu = lambda z: z / (1.0 + np.exp(-z))
        if p + "ffn_gate_inp.weight" in W:
            logits = h @ W[p + "ffn_gate_inp.weight"].T  # [n, n_expert]
            probs = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            gate, up, down = (W[p + f"ffn_{k}_exps.weight"] for k in ("gate", "up", "down"))
            y = np.zeros_like(h)
            for t in range(n):
                order = np.argsort(-probs[t], kind="stable")
                if top_k < len(order):
                    # In logit space: probabilities of unchosen experts can be tiny in absolute terms.
                    min_margin = min(min_margin, logits[t, order[top_k - 1]] - logits[t, order[top_k]])
                sel = order[:top_k]
                w = probs[t, sel] / probs[t, sel].sum()
                for e, we in zip(sel, w):
                    y[t] += we * (down[e] @ (silu(gate[e] @ h[t]) * (up[e] @ h[t])))
            x = x + y
        else:
            g = h @ W[p + "ffn_gate.weight"].T
            u = h @ W[p + "ffn_up.weight"].T
            x = x + (silu(g) * u) @ W[p + "ffn_down.weight"].T

    h = rmsnorm(x, W["output_norm.weight"])
    out_w = W.get("output.weight", W["token_embd.weight"]).reshape(-1, n_embd)
    (h @ out_w.T).astype("<f4").tofile(args.out)
    print(f"min routing logit margin {min_margin:.3g}" if np.isfinite(min_margin) else "dense or top-k = n_expert")


if __name__ == "__main__":
    sys.exit(main())
