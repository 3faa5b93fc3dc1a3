#!/usr/bin/env python3
"""Writes a random-weight deepseek4 GGUF with chosen hyperparameters.

The oracle set in ../shared has one shape (4 layers, compress ratios [0, 4, 128, 4], one hash
layer, ...); these variants move every size and layer pattern the model reads from metadata so
test_deepseek4.cpp can compare xpack-run with deepseek4_reference.py on shapes llama.cpp's oracle
does not cover. Tokenizer metadata is copied from --vocab-from (stories260K.gguf); --hp is a JSON
object overriding the defaults below.
"""
import argparse, json
import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType

ap = argparse.ArgumentParser()
ap.add_argument('out')
ap.add_argument('--vocab-from', required=True)
ap.add_argument('--hp', default='{}')
ap.add_argument('--seed', type=int, default=3)
a = ap.parse_args()
hp = dict(n_embd=48, n_layer=5, n_head=4, head_dim=64, n_rot=16, q_lora=24, o_groups=4, o_rank=8,
          n_swa=10, ratios=[128, 4, 0, 4, 128], idx_heads=4, idx_dim=32, idx_top_k=3, hash=2,
          n_expert=8, n_used=3, n_ff=32, n_shared=2, hc=4, sink_iters=5, clamp=[1.5, 0.0, 2.0, 3.0, 1.0],
          norm=True, scale=2.0, yarn=True)
hp.update(json.loads(a.hp))
rng = np.random.default_rng(a.seed)
rd = GGUFReader(a.vocab_from)
V = len(rd.fields['tokenizer.ggml.tokens'].data)
w = GGUFWriter(a.out, 'deepseek4')
A = 'deepseek4.'
d, L, H, hd = hp['n_embd'], hp['n_layer'], hp['n_head'], hp['head_dim']
w.add_uint32(A + 'block_count', L)
w.add_uint32(A + 'context_length', 4096)
w.add_uint32(A + 'embedding_length', d)
w.add_uint32(A + 'attention.head_count', H)
w.add_uint32(A + 'attention.head_count_kv', 1)
if hp['yarn']:
    w.add_string(A + 'rope.scaling.type', 'yarn')
    w.add_float32(A + 'rope.scaling.factor', 8.0)
    w.add_uint32(A + 'rope.scaling.original_context_length', 4096)
w.add_float32(A + 'rope.freq_base', 10000.0)
w.add_float32(A + 'attention.layer_norm_rms_epsilon', 1e-6)
w.add_uint32(A + 'expert_count', hp['n_expert'])
w.add_uint32(A + 'expert_used_count', hp['n_used'])
w.add_uint32(A + 'expert_gating_func', 4)
w.add_uint32(A + 'attention.key_length', hd)
w.add_uint32(A + 'attention.value_length', hd)
w.add_uint32(A + 'rope.dimension_count', hp['n_rot'])
w.add_uint32(A + 'attention.q_lora_rank', hp['q_lora'])
w.add_uint32(A + 'attention.sliding_window', hp['n_swa'])
w.add_uint32(A + 'expert_feed_forward_length', hp['n_ff'])
w.add_uint32(A + 'expert_shared_count', hp['n_shared'])
w.add_float32(A + 'expert_weights_scale', hp['scale'])
w.add_bool(A + 'expert_weights_norm', hp['norm'])
w.add_array(A + 'swiglu_clamp_exp', [float(x) for x in hp['clamp']])
w.add_uint32(A + 'attention.indexer.head_count', hp['idx_heads'])
w.add_uint32(A + 'attention.indexer.key_length', hp['idx_dim'])
w.add_uint32(A + 'attention.indexer.top_k', hp['idx_top_k'])
w.add_uint32(A + 'attention.output_group_count', hp['o_groups'])
w.add_uint32(A + 'attention.output_lora_rank', hp['o_rank'])
w.add_key_value(A + 'attention.compress_ratios', hp['ratios'], GGUFValueType.ARRAY, GGUFValueType.INT32)
w.add_float32(A + 'attention.compress_rope_freq_base', 80000.0)
w.add_uint32(A + 'hyper_connection.count', hp['hc'])
w.add_uint32(A + 'hyper_connection.sinkhorn_iterations', hp['sink_iters'])
w.add_float32(A + 'hyper_connection.epsilon', 1e-6)
w.add_uint32(A + 'hash_layer_count', hp['hash'])
for k in ['tokenizer.ggml.model', 'tokenizer.ggml.tokens', 'tokenizer.ggml.scores', 'tokenizer.ggml.token_type',
          'tokenizer.ggml.bos_token_id', 'tokenizer.ggml.eos_token_id', 'tokenizer.ggml.unknown_token_id']:
    f = rd.fields[k]
    t = GGUFValueType(f.types[0])
    if t == GGUFValueType.ARRAY:
        sub = GGUFValueType(f.types[1])
        if sub == GGUFValueType.STRING:
            v = [bytes(f.parts[i]).decode('utf-8') for i in f.data]
        else:
            v = [f.parts[i].tolist()[0] for i in f.data]
        w.add_key_value(k, v, t, sub)
    elif t == GGUFValueType.STRING:
        w.add_key_value(k, bytes(f.parts[f.data[0]]).decode(), t)
    else:
        w.add_key_value(k, f.parts[f.data[0]].tolist()[0], t)


def T(name, ne, std=0.2, mean=0.0):
    """A random F32 tensor of ggml shape ne (numpy holds it reversed)."""
    x = (rng.standard_normal(tuple(reversed(ne))) * std + mean).astype(np.float32)
    w.add_tensor(name, x)

hc, mix = hp['hc'], (2 + hp['hc']) * hp['hc']
T('token_embd.weight', [d, V], 1.0)
T('output_norm.weight', [d], 0.1, 1.0)
T('output.weight', [d, V], 0.3)
T('output_hc_fn.weight', [hc * d, hc], 0.2)
T('output_hc_base.weight', [hc], 0.5)
T('output_hc_scale.weight', [1], 0.2, 1.0)
ql, G, R = hp['q_lora'], hp['o_groups'], hp['o_rank']
E, K, F, S = hp['n_expert'], hp['n_used'], hp['n_ff'], hp['n_shared']
for il in range(L):
    b = f'blk.{il}.'
    r = hp['ratios'][il]
    T(b + 'attn_norm.weight', [d], 0.1, 1.0)
    T(b + 'attn_sinks.weight', [H], 1.0)
    T(b + 'attn_q_a.weight', [d, ql])
    T(b + 'attn_q_a_norm.weight', [ql], 0.1, 1.0)
    T(b + 'attn_q_b.weight', [ql, H * hd])
    T(b + 'attn_kv.weight', [d, hd])
    T(b + 'attn_kv_a_norm.weight', [hd], 0.1, 1.0)
    T(b + 'attn_output_a.weight', [H * hd // G, R * G])
    T(b + 'attn_output_b.weight', [G * R, d])
    for s in ['attn', 'ffn']:
        T(b + f'hc_{s}_fn.weight', [hc * d, mix])
        T(b + f'hc_{s}_base.weight', [mix], 0.5)
        T(b + f'hc_{s}_scale.weight', [3], 0.2, 1.0)
    if r:
        c = 2 if r == 4 else 1
        T(b + 'attn_compressor_kv.weight', [d, c * hd])
        T(b + 'attn_compressor_gate.weight', [d, c * hd])
        T(b + 'attn_compressor_ape.weight', [c * hd, r], 0.5)
        T(b + 'attn_compressor_norm.weight', [hd], 0.1, 1.0)
        if r == 4:
            ID = hp['idx_dim']
            T(b + 'indexer.proj.weight', [d, hp['idx_heads']])
            T(b + 'indexer.attn_q_b.weight', [ql, hp['idx_heads'] * ID])
            T(b + 'indexer_compressor_kv.weight', [d, 2 * ID])
            T(b + 'indexer_compressor_gate.weight', [d, 2 * ID])
            T(b + 'indexer_compressor_ape.weight', [2 * ID, 4], 0.5)
            T(b + 'indexer_compressor_norm.weight', [ID], 0.1, 1.0)
    T(b + 'ffn_gate_inp.weight', [d, E])
    if il < hp['hash']:
        w.add_tensor(b + 'ffn_gate_tid2eid.weight', rng.integers(0, E, size=(V, K), dtype=np.int32))
    else:
        T(b + 'exp_probs_b.bias', [E], 0.1)
    T(b + 'ffn_norm.weight', [d], 0.1, 1.0)
    T(b + 'ffn_gate_exps.weight', [d, F, E])
    T(b + 'ffn_down_exps.weight', [F, d, E])
    T(b + 'ffn_up_exps.weight', [d, F, E])
    T(b + 'ffn_gate_shexp.weight', [d, F * S])
    T(b + 'ffn_down_shexp.weight', [F * S, d])
    T(b + 'ffn_up_shexp.weight', [d, F * S])
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
