#!/usr/bin/env python3
"""An independent float64 numpy forward pass of a deepseek4 GGUF with F32 tensors.

usage: deepseek4_reference.py MODEL.gguf IDS(1,2,3) OUT.f32  -> one float32 logits row per id.

Written from the model's equations (mHC with Sinkhorn, Q-LoRA MQA with partial RoPE/YaRN, sliding
window, CSA/HCA compressed blocks with the lightning indexer's top-k, sinks, grouped output LoRA,
hash / sqrt-softplus routing, clamped SwiGLU) without sharing code with xpack-run, whole sequence at
once, in float64. It agrees with llama.cpp's oracle logits to ~1e-5; test_deepseek4.cpp uses it on
variant shapes the oracle does not cover.
"""
import sys
import numpy as np
from gguf import GGUFReader, GGUFValueType

path, ids_arg, out = sys.argv[1], sys.argv[2], sys.argv[3]
ids = [int(x) for x in ids_arg.split(',')]
rd = GGUFReader(path)
A = 'deepseek4.'


def kv(name, default=None):
    f = rd.fields.get(name)
    if f is None:
        return default
    t = GGUFValueType(f.types[0])
    if t == GGUFValueType.ARRAY:
        return [f.parts[i].tolist()[0] for i in f.data]
    if t == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    return f.parts[f.data[0]].tolist()[0]


TW = {t.name: t for t in rd.tensors}


def W(name):
    t = TW[name]
    a = np.array(t.data)
    return a.astype(np.float64) if a.dtype != np.int32 else a


L = kv(A + 'block_count'); d = kv(A + 'embedding_length'); H = kv(A + 'attention.head_count')
hd = kv(A + 'attention.key_length'); nr = kv(A + 'rope.dimension_count'); eps = kv(A + 'attention.layer_norm_rms_epsilon')
nswa = kv(A + 'attention.sliding_window'); ratios = kv(A + 'attention.compress_ratios')
topk = kv(A + 'attention.indexer.top_k', 0); G = kv(A + 'attention.output_group_count'); R = kv(A + 'attention.output_lora_rank')
hc = kv(A + 'hyper_connection.count'); iters = kv(A + 'hyper_connection.sinkhorn_iterations'); hc_eps = kv(A + 'hyper_connection.epsilon')
E = kv(A + 'expert_count'); K = kv(A + 'expert_used_count'); n_hash = kv(A + 'hash_layer_count')
wnorm = kv(A + 'expert_weights_norm'); wscale = kv(A + 'expert_weights_scale')
clamp = kv(A + 'swiglu_clamp_exp'); clamp_sh = kv(A + 'swiglu_clamp_shexp', clamp)
if not isinstance(clamp, list): clamp = [clamp] * L
if not isinstance(clamp_sh, list): clamp_sh = [clamp_sh] * L
base_raw = kv(A + 'rope.freq_base', 10000.0); base_c = kv(A + 'attention.compress_rope_freq_base')
yarn = kv(A + 'rope.scaling.type', 'linear') == 'yarn'
factor = kv(A + 'rope.scaling.factor', 0.0); fs = 1.0 / factor if factor else 1.0
n_orig = kv(A + 'rope.scaling.original_context_length', kv(A + 'context_length'))
bfast = kv(A + 'rope.scaling.yarn_beta_fast', 32.0); bslow = kv(A + 'rope.scaling.yarn_beta_slow', 1.0)


def rms(x, w=None):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


def angles(pos, compressed):
    i = np.arange(nr // 2)
    base = base_c if compressed else base_raw
    extrap = pos * base ** (-2.0 * i / nr)
    if not compressed or not yarn:
        return extrap * (fs if compressed else 1.0)
    def corr(b):
        return nr * np.log(n_orig / (b * 2 * np.pi)) / (2 * np.log(base))
    lo, hi = max(0.0, np.floor(corr(bfast))), min(nr - 1.0, np.ceil(corr(bslow)))
    ramp = 1 - np.clip((i - lo) / max(0.001, hi - lo), 0, 1)
    return fs * extrap * (1 - ramp) + extrap * ramp


def rope(x, pos, compressed, inverse=False):
    # x [..., nr] rotated as adjacent pairs; unit magnitude (DeepSeek-V4 cancels YaRN's mscale)
    a = angles(pos, compressed) * (-1 if inverse else 1)
    c, s = np.cos(a), np.sin(a)
    y = x.copy()
    y[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    y[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
    return y


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def hc_pre(x, p):
    T = x.shape[0]
    m = rms(x.reshape(T, hc * d)) @ W(p + '_fn.weight').T
    b, s = W(p + '_base.weight'), W(p + '_scale.weight')
    pre = sigmoid(m[:, :hc] * s[0] + b[:hc]) + hc_eps
    post = 2 * sigmoid(m[:, hc:2 * hc] * s[1] + b[hc:2 * hc])
    c = softmax((m[:, 2 * hc:] * s[2] + b[2 * hc:]).reshape(T, hc, hc), axis=2) + hc_eps  # [t, src, dst]
    c = c / (c.sum(axis=1, keepdims=True) + hc_eps)
    for _ in range(iters - 1):
        c = c / (c.sum(axis=2, keepdims=True) + hc_eps)
        c = c / (c.sum(axis=1, keepdims=True) + hc_eps)
    return np.einsum('th,thd->td', pre, x), post, c


def hc_post(f, res, post, comb):
    return post[:, :, None] * f[:, None, :] + np.einsum('tsk,tsd->tkd', comb, res)


def compress(h, pre, ratio, width, overlap):
    T = h.shape[0]
    kvr = h @ W(pre + '_kv.weight').T
    sc = h @ W(pre + '_gate.weight').T + W(pre + '_ape.weight')[np.arange(T) % ratio]
    blocks = []
    for b in range(T // ratio):
        cur = slice(b * ratio, (b + 1) * ratio)
        if overlap:
            if b > 0:
                prv = slice((b - 1) * ratio, b * ratio)
                pv, ps = kvr[prv, :width], sc[prv, :width]
            else:
                pv, ps = np.zeros((ratio, width)), np.full((ratio, width), -np.inf)
            v = np.concatenate([pv, kvr[cur, width:]]); s = np.concatenate([ps, sc[cur, width:]])
        else:
            v, s = kvr[cur], sc[cur]
        k = rms((softmax(s, axis=0) * v).sum(axis=0), W(pre + '_norm.weight'))
        k[-nr:] = rope(k[-nr:], b * ratio, True)
        blocks.append(k)
    return np.array(blocks).reshape(-1, width)


def attention(il, h):
    T = h.shape[0]; p = f'blk.{il}.'; r = ratios[il]; cmp_ = r != 0
    qr = rms(h @ W(p + 'attn_q_a.weight').T, W(p + 'attn_q_a_norm.weight'))
    q = rms((qr @ W(p + 'attn_q_b.weight').T).reshape(T, H, hd))
    kvv = rms(h @ W(p + 'attn_kv.weight').T, W(p + 'attn_kv_a_norm.weight'))
    for t in range(T):
        q[t, :, -nr:] = rope(q[t, :, -nr:], t, cmp_)
        kvv[t, -nr:] = rope(kvv[t, -nr:], t, cmp_)
    blocks = compress(h, p + 'attn_compressor', r, hd, r == 4) if r else np.zeros((0, hd))
    if r == 4:
        ID = kv(A + 'attention.indexer.key_length'); IH = kv(A + 'attention.indexer.head_count')
        ik = compress(h, p + 'indexer_compressor', 4, ID, True)
        iq = (qr @ W(p + 'indexer.attn_q_b.weight').T).reshape(T, IH, ID)
        for t in range(T):
            iq[t, :, -nr:] = rope(iq[t, :, -nr:], t, True)
        iw = (h @ W(p + 'indexer.proj.weight').T) / np.sqrt(ID * IH)
    sinks = W(p + 'attn_sinks.weight')
    out = np.zeros((T, H, hd))
    for t in range(T):
        keys = [kvv[s] for s in range(max(0, t - nswa + 1), t + 1)]
        nvis = (t + 1) // r if r else 0
        chosen = list(range(nvis))
        if r == 4 and nvis > topk:
            score = np.array([(iw[t] * np.maximum(0, iq[t] @ ik[b])).sum() for b in range(nvis)])
            chosen = sorted(np.argsort(-score, kind='stable')[:topk])
        keys += [blocks[b] for b in chosen]
        Kt = np.array(keys)
        lg = q[t] @ Kt.T / np.sqrt(hd)  # [H, n]
        mx = np.maximum(lg.max(axis=1), sinks)
        e = np.exp(lg - mx[:, None]); z = e.sum(axis=1) + np.exp(sinks - mx)
        o = (e / z[:, None]) @ Kt
        o[:, -nr:] = rope(o[:, -nr:], t, cmp_, inverse=True)
        out[t] = o
    gd = H * hd // G
    woa = W(p + 'attn_output_a.weight')  # [R*G, gd]
    heads = out.reshape(T, G, gd)
    low = np.concatenate([heads[:, g] @ woa[g * R:(g + 1) * R].T for g in range(G)], axis=1)
    return low @ W(p + 'attn_output_b.weight').T


def swiglu(g, u, lim):
    if lim > 1e-6:
        g = np.minimum(g, lim); u = np.clip(u, -lim, lim)
    return g / (1 + np.exp(-g)) * u


def moe(il, h, toks):
    p = f'blk.{il}.'
    s = np.sqrt(np.log1p(np.exp(h @ W(p + 'ffn_gate_inp.weight').T)))
    gate, up, down = W(p + 'ffn_gate_exps.weight'), W(p + 'ffn_up_exps.weight'), W(p + 'ffn_down_exps.weight')
    y = np.zeros_like(h)
    for t in range(h.shape[0]):
        if il < n_hash:
            sel = W(p + 'ffn_gate_tid2eid.weight')[toks[t]]
        else:
            sel = np.argsort(-(s[t] + W(p + 'exp_probs_b.bias')), kind='stable')[:K]
        w = s[t][sel]
        if wnorm: w = w / max(w.sum(), 6.103515625e-5)
        if wscale not in (0.0, 1.0): w = w * wscale
        for e, we in zip(sel, w):
            y[t] += we * (down[e] @ swiglu(gate[e] @ h[t], up[e] @ h[t], clamp[il]))
    sh = swiglu(h @ W(p + 'ffn_gate_shexp.weight').T, h @ W(p + 'ffn_up_shexp.weight').T, clamp_sh[il])
    return y + sh @ W(p + 'ffn_down_shexp.weight').T


T = len(ids)
x = np.repeat(W('token_embd.weight')[ids][:, None, :], hc, axis=1)
for il in range(L):
    p = f'blk.{il}.'
    res = x
    h, post, comb = hc_pre(x, p + 'hc_attn')
    x = hc_post(attention(il, rms(h, W(p + 'attn_norm.weight'))), res, post, comb)
    res = x
    h, post, comb = hc_pre(x, p + 'hc_ffn')
    x = hc_post(moe(il, rms(h, W(p + 'ffn_norm.weight')), ids), res, post, comb)
m = rms(x.reshape(T, hc * d)) @ W('output_hc_fn.weight').T
pre = sigmoid(m * W('output_hc_scale.weight')[0] + W('output_hc_base.weight')) + hc_eps
h = rms(np.einsum('th,thd->td', pre, x), W('output_norm.weight'))
(h @ W('output.weight').T).astype(np.float32).tofile(out)
