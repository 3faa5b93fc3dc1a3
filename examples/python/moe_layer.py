#!/usr/bin/env python3
"""A DeepSeek-V4 MoE layer in PyTorch whose routed experts come from libxpack.

This is the shape of SGLang's expert_pack MoE layer (doc/python.md, "An engine's
expert loader"): the router's top-k, then one ``acquire`` of the layer's experts
from the expert cache, the expert FFNs computed on views of the cache slots (no
copy of the expert bytes), the weighted combine, and the release on the stream
that read the slots. What an engine keeps resident (router, shared expert) is read
from the trunk GGUF once, with gguf-py; the routed experts never leave the pack
and the cache.

The routed experts are MXFP4 (the deepseek4-mxfp4 oracle model, and DeepSeek-V4-
Flash): ``mxfp4_to_float`` decodes a slot's bytes with torch operations on the
slot's device (the layout of doc/pack-format.md's roles and of ggml's block_mxfp4:
17-byte blocks of 32 values, an E8M0 scale and 16 bytes of E2M1 codes, low nibbles
first). Decoding every expert to float32 before each matmul is what this example
does for clarity; a serving engine runs a fused MXFP4 kernel on the same slot view
instead (cuda/ has the project's).

Semantics follow xpack-run's deepseek4 MoE block (examples/xpack-run/models/
deepseek4/moe.h), which test/runtime/moe_layer_ref.cpp runs for the comparison in
python/tests/test_moe_layer.py:
  scores  s = sqrt(softplus(ffn_gate_inp . x))
  experts hash layers: ffn_gate_tid2eid[token]; others: top-k of s + exp_probs_b
  weights s of the chosen experts / max(sum, 6.1e-5) (expert_weights_norm), x scale
  expert  down . (silu(min(gate . x, L)) * clamp(up . x, -L, L)), L = swiglu_clamp_exp
  output  shared expert (L = swiglu_clamp_shexp) + sum of the weighted routed experts

usage: moe_layer.py TRUNK.gguf PACK.xpack [--layer N] [--tokens 1,5,9] [--device cpu|cuda]
Prints the layer's routing and output norm for random inputs (seeded).
"""
from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

import xpack

# ggml's kvalues_mxfp4: twice the E2M1 values, so the scale is 2^(e - 128).
_MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
_MXFP4_BLOCK, _MXFP4_BYTES = 32, 17


def mxfp4_to_float(raw: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """float32 [rows, cols] from ``rows * cols / 32`` MXFP4 blocks (uint8, any device).

    Row r holds output r's ``cols`` weights (ggml order: the contiguous dimension
    is the input)."""
    if cols % _MXFP4_BLOCK:
        raise ValueError(f"MXFP4 rows of {cols} values are not whole blocks")
    n_blocks = rows * cols // _MXFP4_BLOCK
    if raw.dtype != torch.uint8 or raw.numel() != n_blocks * _MXFP4_BYTES:
        raise ValueError(f"expected {n_blocks * _MXFP4_BYTES} uint8 bytes of MXFP4, got {raw.numel()} {raw.dtype}")
    blocks = raw.reshape(n_blocks, _MXFP4_BYTES)
    table = torch.tensor(_MXFP4_VALUES, dtype=torch.float32, device=raw.device)
    codes = blocks[:, 1:].to(torch.int64)
    values = torch.cat([table[codes & 0xF], table[codes >> 4]], dim=1)  # split halves: j, then j + 16
    # 2^(e - 128) built from its float32 bits, exact on every device (a pow() need not
    # be): (e - 1) << 23 for e >= 2, the subnormals 2^-127 and 2^-128 below.
    e = blocks[:, :1].to(torch.int32)
    scale = torch.where(e >= 2, (e - 1) << 23, 0x00200000 << e).view(torch.float32)
    return (values * scale).reshape(rows, cols)


def role_matrix(slot: torch.Tensor, role: xpack.Role) -> torch.Tensor:
    """One role of an expert object as float32 [outputs, inputs], decoded from the slot's bytes."""
    cols, rows = role.shape[0], role.shape[1]
    raw = slot[role.offset: role.offset + role.nbytes]
    if role.type_name == "MXFP4":
        return mxfp4_to_float(raw, rows, cols)
    if role.type_name == "F32":
        return raw.view(torch.float32).reshape(rows, cols)
    raise NotImplementedError(f"role {role.name}: {role.type_name} experts (this example decodes MXFP4 and F32)")


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        raise KeyError(f"{key} is not in the trunk")
    vals = [f.parts[i] for i in f.data]
    return [v.tolist()[0] if len(v) == 1 else v.tolist() for v in vals]


@dataclass
class ResidentLayer:
    """What an engine keeps in device memory for one deepseek4 MoE layer."""

    router: torch.Tensor                 # [n_expert, n_embd]
    bias: Optional[torch.Tensor]         # [n_expert] (learned routers)
    tid2eid: Optional[torch.Tensor]      # [n_vocab, top_k] (hash-routed layers)
    shared: Tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # gate, up [ff, n_embd]; down [n_embd, ff]
    clamp_exp: float
    clamp_shexp: float


class Deepseek4Trunk:
    """The trunk GGUF's MoE hyperparameters and resident tensors (gguf-py)."""

    def __init__(self, path: str, device: torch.device):
        import gguf  # gguf-py: the reference reader of the format

        self.reader = gguf.GGUFReader(path)
        self.device = device
        arch = _field(self.reader, "general.architecture")[0]
        arch = bytes(arch).decode() if isinstance(arch, list) else arch
        if arch != "deepseek4":
            raise ValueError(f"{path}: architecture {arch!r}, this layer is deepseek4's")
        k = lambda name: _field(self.reader, f"deepseek4.{name}")[0]  # noqa: E731
        self.n_embd, self.n_expert, self.top_k = k("embedding_length"), k("expert_count"), k("expert_used_count")
        self.n_hash_layers = k("hash_layer_count")
        self.weights_scale = float(k("expert_weights_scale"))
        self.weights_norm = bool(k("expert_weights_norm"))
        self.clamp_exp = [float(v) for v in _field(self.reader, "deepseek4.swiglu_clamp_exp")]
        self.clamp_shexp = [float(v) for v in _field(self.reader, "deepseek4.swiglu_clamp_shexp")]
        self._tensors = {t.name: t for t in self.reader.tensors}

    def _float(self, name: str) -> torch.Tensor:
        import gguf

        t = self._tensors[name]
        a = t.data if t.tensor_type == gguf.GGMLQuantizationType.F32 else gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # ggml ne -> row-major
        return torch.from_numpy(np.array(a, dtype=np.float32).reshape(shape)).to(self.device)  # a copy: resident

    def layer(self, block: int) -> ResidentLayer:
        p = f"blk.{block}."
        hashed = block < self.n_hash_layers
        tid2eid = None
        if hashed:
            t = self._tensors[p + "ffn_gate_tid2eid.weight"]
            tid2eid = torch.from_numpy(np.array(t.data, dtype=np.int64).reshape(-1, self.top_k)).to(self.device)
        return ResidentLayer(
            router=self._float(p + "ffn_gate_inp.weight"),
            bias=None if hashed else self._float(p + "exp_probs_b.bias"),
            tid2eid=tid2eid,
            shared=tuple(self._float(p + f"ffn_{r}_shexp.weight") for r in ("gate", "up", "down")),
            clamp_exp=self.clamp_exp[block],
            clamp_shexp=self.clamp_shexp[block],
        )


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    if limit > 1e-6:
        gate, up = torch.clamp(gate, max=limit), torch.clamp(up, -limit, limit)
    return torch.nn.functional.silu(gate) * up


class ExpertPackMoE(torch.nn.Module):
    """One deepseek4 MoE layer whose routed experts live in an Expert Pack.

    ``forward(x [n, n_embd] float32, tokens [n] int64)`` returns [n, n_embd]; the
    last call's routing is kept in ``last_ids`` / ``last_weights`` / ``last_margin``
    (the gap between the k-th and (k+1)-th selection score: near 0 a rounding
    difference may legitimately pick another expert)."""

    def __init__(self, trunk: Deepseek4Trunk, block: int, pack: xpack.Pack, cache: xpack.Cache):
        super().__init__()
        self.trunk, self.block, self.pack, self.cache = trunk, block, pack, cache
        self.layer = pack.layer_of(block)  # the pack's MoE row of this block
        self.w = trunk.layer(block)
        self.roles = {r: pack.role(r) for r in ("gate", "up", "down")}
        self.device = trunk.device
        self.last_ids = self.last_weights = self.last_margin = None

    def route(self, x: torch.Tensor, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Top-k expert ids [n, k] (best first) and their combine weights [n, k]."""
        t = self.trunk
        scores = torch.sqrt(torch.nn.functional.softplus(x @ self.w.router.T))
        if self.w.tid2eid is not None:
            ids = self.w.tid2eid[tokens]
            margin = torch.full((x.shape[0],), float("inf"), device=x.device)
        else:
            biased = scores + self.w.bias
            top = torch.topk(biased, t.top_k + 1, dim=1)
            ids = top.indices[:, : t.top_k]
            margin = top.values[:, t.top_k - 1] - top.values[:, t.top_k]
        weights = torch.gather(scores, 1, ids)
        if t.weights_norm:
            weights = weights / torch.clamp(weights.sum(dim=1, keepdim=True), min=6.103515625e-5)
        if t.weights_scale not in (0.0, 1.0):
            weights = weights * t.weights_scale
        self.last_ids, self.last_weights, self.last_margin = ids, weights, margin
        return ids, weights

    def _slot(self, request: xpack.Request, i: int) -> torch.Tensor:
        """Entry i's cache slot as a uint8 tensor on the compute device, without a copy."""
        view = request.view(i)
        if self.device.type == "cuda":
            return torch.from_dlpack(view)  # DLPack makes the current stream wait for the slot's bytes
        with warnings.catch_warnings():
            # The host slot is read-only memory the cache owns; torch only reads it.
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(view)

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        ids, weights = self.route(x, tokens)
        gate_s, up_s, down_s = self.w.shared
        out = swiglu(x @ gate_s.T, x @ up_s.T, self.w.clamp_shexp) @ down_s.T
        experts: List[int] = sorted(set(ids.flatten().tolist()))
        with self.cache.acquire(self.layer, experts, n_tokens=x.shape[0]) as request:
            # Resident experts first: their compute overlaps the others' reads.
            order = sorted(range(len(experts)), key=lambda i: not request.hit(i))
            for i in order:
                slot = self._slot(request, i)
                gate, up, down = (role_matrix(slot, self.roles[r]) for r in ("gate", "up", "down"))
                rows, ranks = torch.nonzero(ids == experts[i], as_tuple=True)
                h = swiglu(x[rows] @ gate.T, x[rows] @ up.T, self.w.clamp_exp) @ down.T
                out.index_add_(0, rows, h * weights[rows, ranks].unsqueeze(1))
            stream = torch.cuda.current_stream().cuda_stream if self.device.type == "cuda" else None
            request.release(stream=stream)  # the slots may take other experts once this stream's work is done
        return out


def open_layer(trunk_path: str, pack_path: str, block: int, device: str = "cpu",
               budget_bytes: int = 64 << 20) -> Tuple[ExpertPackMoE, xpack.Pack, xpack.Cache]:
    """The layer over a pack and a cache on ``device`` ("cpu": the host cache; "cuda": VRAM slots)."""
    dev = torch.device(device)
    pack = xpack.Pack(pack_path, trunk=trunk_path)
    cache = xpack.Cache(pack, budget_bytes=budget_bytes, device="cuda" if dev.type == "cuda" else "host",
                        direct_io=False)
    return ExpertPackMoE(Deepseek4Trunk(trunk_path, dev), block, pack, cache), pack, cache


def layer_inputs(n_embd: int, n: int, seed: int) -> np.ndarray:
    """Random FFN inputs with RMS 1 (what ffn_norm gives the layer), float32 [n, n_embd]."""
    x = np.random.default_rng(seed).standard_normal((n, n_embd)).astype(np.float32)
    return (x / np.sqrt((x * x).mean(axis=1, keepdims=True))).astype(np.float32)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trunk")
    ap.add_argument("pack")
    ap.add_argument("--layer", type=int, default=1, help="GGUF block (default 1)")
    ap.add_argument("--tokens", default="1,5,9,200", help="token ids, one per input row")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    tokens = [int(t) for t in a.tokens.split(",")]
    layer, pack, cache = open_layer(a.trunk, a.pack, a.layer, a.device)
    with pack, cache:
        x = torch.from_numpy(layer_inputs(layer.trunk.n_embd, len(tokens), a.seed)).to(layer.device)
        y = layer(x, torch.tensor(tokens, device=layer.device))
        print(f"layer {a.layer}: experts {layer.last_ids.tolist()}")
        print(f"output norm per token {[round(v, 5) for v in y.norm(dim=1).tolist()]}")
        c = cache.counters()
        print(f"cache: hits {int(c['cache_hits'])}, misses {int(c['cache_misses'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
