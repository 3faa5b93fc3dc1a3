"""examples/python/moe_layer.py, the SGLang-shaped MoE layer over libxpack, against
xpack-run's own deepseek4 MoE block (test/runtime/moe_layer_ref.cpp) on the same
layer inputs, for every layer of the deepseek4-mxfp4 oracle model (hash-routed
layer 0 and the learned routers of 1-3): on the host cache with CPU torch, and on
a CUDA cache with torch on the GPU (marker gpu). Skipped, with the reason, where
torch, gguf-py, ../shared's oracle model or the reference program is absent."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import xpack
from conftest import build_dir, run, skip_absent

pytestmark = pytest.mark.torch  # meson test python_torch (and python_gpu for the CUDA case)

N_TOKENS = 8
# xpack-run and torch both multiply dequantized float32 weights; they differ only
# in summation order (about 1e-6 here), far below what a wrong expert, weight or
# clamp would change (the outputs are of order 0.1-1).
ATOL, RTOL = 2e-5, 1e-4


def _torch():
    try:
        return importlib.import_module("torch")
    except ImportError as e:
        skip_absent("capability", f"torch is absent ({e}): pip install torch (CPU wheels suffice)")


def _example():
    _torch()
    try:
        importlib.import_module("gguf")
    except ImportError as e:
        skip_absent("fixture", f"gguf-py is absent ({e}): the example reads the trunk with it")
    d = os.environ.get("XPACK_EXAMPLES") or str(Path(__file__).resolve().parents[2] / "examples" / "python")
    if d not in sys.path:
        sys.path.insert(0, d)
    return importlib.import_module("moe_layer")


@pytest.fixture(scope="module")
def oracle_pack(tmp_path_factory) -> dict:
    shared = Path(os.environ.get("XPACK_SHARED", Path(__file__).resolve().parents[3] / "shared"))
    model = shared / "oracle" / "models" / "deepseek4-mxfp4.gguf"
    if not model.exists():
        skip_absent("fixture", f"{model} is absent (../shared/oracle)")
    ref = os.environ.get("XPACK_MOE_LAYER_REF") or str(build_dir() / "test" / "runtime" / "moe_layer_ref")
    if not Path(ref).exists():
        skip_absent("fixture", f"{ref} not built (test/runtime/moe_layer_ref.cpp)")
    d = tmp_path_factory.mktemp("oracle")
    run(build_dir() / "tools" / "xpack-build", model, "-o", d / "ds4")
    return {"trunk": d / "ds4.trunk.gguf", "pack": d / "ds4.xpack", "ref": ref, "dir": d}


def _inputs(m, block: int):
    x = m.layer_inputs(64, N_TOKENS, seed=100 + block)
    tokens = [(37 * i + 11 * block + 3) % 512 for i in range(N_TOKENS)]
    return x, tokens


def _reference(pack: dict, block: int, x: np.ndarray, tokens) -> np.ndarray:
    xf, yf = pack["dir"] / f"x{block}.f32", pack["dir"] / f"y{block}.f32"
    x.astype("<f4").tofile(xf)
    run(pack["ref"], pack["trunk"], pack["pack"], block, xf, ",".join(map(str, tokens)), yf)
    return np.fromfile(yf, dtype="<f4").reshape(x.shape)


def _check_layers(pack: dict, device: str) -> None:
    m, torch = _example(), _torch()
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 matmuls, as the CPU reference
    for block in range(4):
        layer, p, cache = m.open_layer(str(pack["trunk"]), str(pack["pack"]), block, device)
        with p, cache:
            assert layer.layer == block and p.block_of(layer.layer) == block
            x, tokens = _inputs(m, block)
            want = _reference(pack, block, x, tokens)
            xt = torch.from_numpy(x).to(device)
            tt = torch.tensor(tokens, device=device)
            got = layer(xt, tt).cpu().numpy()
            # Inputs whose k-th and (k+1)-th selection scores nearly tie could route
            # differently on a rounding difference: these do not (a check on the inputs).
            assert float(layer.last_margin.min()) > 1e-4, f"layer {block}: near-tie in routing, pick other inputs"
            err = np.abs(got - want)
            assert np.all(err <= ATOL + RTOL * np.abs(want)), (
                f"layer {block} ({device}): max |diff| {err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)}")
            assert np.abs(want).max() > 1e-2  # a layer that outputs ~0 would agree with anything
            n_distinct = len(set(layer.last_ids.flatten().tolist()))
            c = cache.counters()
            assert int(c["cache_misses"]) == n_distinct and int(c["cache_hits"]) == 0
            # The same inputs again: every expert is in the cache now, and the output is the same.
            again = layer(xt, tt).cpu().numpy()
            c = cache.counters()
            assert int(c["cache_hits"]) == n_distinct and int(c["cache_misses"]) == n_distinct
            assert np.array_equal(again, got)


def test_mxfp4_decode_matches_gguf_py():
    m, torch = _example(), _torch()
    gguf = importlib.import_module("gguf")
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, size=(4 * 2, 17), dtype=np.uint8)
    blocks[:, 0] = rng.integers(100, 140, size=8)  # E8M0 scales around 1
    blocks[:3, 0] = (0, 1, 255)  # and the edges: the two subnormal scales, 2^127
    with np.errstate(over="ignore"):  # 12 x 2^127 is inf, in ggml as in gguf-py
        want = gguf.quants.dequantize(blocks.reshape(4, 2 * 17), gguf.GGMLQuantizationType.MXFP4)
    got = m.mxfp4_to_float(torch.from_numpy(blocks.reshape(-1)), 4, 64).numpy()
    assert np.array_equal(got, want.reshape(4, 64))
    with pytest.raises(ValueError):
        m.mxfp4_to_float(torch.zeros(16, dtype=torch.uint8), 1, 32)  # one byte short of a block
    with pytest.raises(ValueError):
        m.mxfp4_to_float(torch.zeros(17, dtype=torch.uint8), 1, 16)  # not whole blocks


def test_moe_layer_matches_xpack_run_on_the_host(oracle_pack):
    _check_layers(oracle_pack, "cpu")


def test_moe_layer_refuses_bad_input(oracle_pack):
    m, torch = _example(), _torch()
    with pytest.raises(ValueError, match="deepseek4"):
        m.Deepseek4Trunk(str(_other_arch(oracle_pack)), torch.device("cpu"))
    layer, p, cache = m.open_layer(str(oracle_pack["trunk"]), str(oracle_pack["pack"]), 1, "cpu")
    x, tokens = _inputs(m, 1)
    cache.close()
    with pytest.raises(xpack.ClosedError):
        layer(torch.from_numpy(x), torch.tensor(tokens))
    p.close()
    with pytest.raises(xpack.XpackError):
        m.open_layer(str(oracle_pack["trunk"]), str(oracle_pack["dir"] / "absent.xpack"), 1, "cpu")


def _other_arch(pack: dict) -> Path:
    """A mixtral GGUF made by xpack-synth: a trunk of the wrong architecture."""
    out = pack["dir"] / "mixtral.gguf"
    if not out.exists():
        run(build_dir() / "tools" / "xpack-synth", "--arch", "mixtral", "--layers", "1", "-q", "-o", out)
    return out


@pytest.mark.gpu
def test_moe_layer_matches_xpack_run_on_cuda(oracle_pack):
    torch = _torch()
    if not torch.cuda.is_available():
        skip_absent("capability", "no CUDA device for torch")
    _check_layers(oracle_pack, "cuda")
