"""xpack.Pack against the source GGUF read independently by gguf-py, and its refusals."""

from __future__ import annotations

import os
import shutil
import threading

import numpy as np
import pytest

import xpack
from conftest import skip_absent


def gguf_reader(path):
    try:
        import gguf  # llama.cpp's own package: an independent reader of the source
    except ImportError as e:
        skip_absent("fixture", f"the gguf Python package is absent: {e}")
    return gguf.GGUFReader(str(path))


def test_version_and_types():
    assert xpack.version().count(".") == 2
    assert xpack.type_name(xpack.GgmlType.MXFP4) == "MXFP4"
    assert xpack.type_block(xpack.GgmlType.Q2_K) == (256, 84)
    with pytest.raises(xpack.XpackError) as e:
        xpack.type_name(12345)
    assert e.value.code == xpack.Status.UNKNOWN_TYPE


def test_info_roles_and_objects_equal_the_source_gguf(mixtral_pack):
    src = gguf_reader(mixtral_pack["gguf"])
    tensors = {t.name: t for t in src.tensors}
    with xpack.Pack(mixtral_pack["pack"], trunk=mixtral_pack["trunk"]) as p:
        info = p.info
        assert (info.n_layers, info.n_experts, info.n_experts_used) == (3, 4, 2)
        assert info.arch == "llama"
        assert info.alignment == 4096 and info.object_stride % 4096 == 0
        assert {r.name for r in info.roles} == {"gate", "up", "down"}
        assert len(info.source_sha256) == 32
        for layer in range(info.n_layers):
            block = p.block_of(layer)
            assert p.layer_of(block) == layer
            for e in range(info.n_experts):
                obj = p.read_object(layer, e)
                assert obj.nbytes == info.object_bytes
                assert p.object_offset(layer, e) == info.data_start + (layer * info.n_experts + e) * info.object_stride
                for role in info.roles:
                    name = p.role_source(role.index, block)
                    t = tensors[name]
                    raw = np.asarray(t.data).view(np.uint8).reshape(-1)
                    per_expert = raw.nbytes // info.n_experts
                    assert per_expert == role.nbytes
                    want = raw[e * per_expert:(e + 1) * per_expert]
                    assert np.array_equal(p.role_view(obj, role), want), (layer, e, role.name)
        # A caller's buffer is filled in place.
        buf = np.zeros(info.object_bytes + 100, dtype=np.uint8)
        out = p.read_object(1, 2, out=buf)
        assert out.base is buf or out.base is buf.base
        assert np.array_equal(out, p.read_object(1, 2))
        p.validate(checksums=True)
    assert p.closed
    with pytest.raises(xpack.ClosedError):
        p.read_object(0, 0)
    with pytest.raises(xpack.ClosedError):
        _ = p.info
    p.close()  # twice is fine


def test_bad_arguments_raise_and_never_crash(mixtral_pack):
    with xpack.Pack(mixtral_pack["pack"]) as p:
        for layer, expert in ((3, 0), (-1, 0), (0, 4), (0, -1), (1 << 40, 0)):
            with pytest.raises(IndexError):
                p.read_object(layer, expert)
        with pytest.raises(TypeError):
            p.read_object(0.5, 0)
        assert p.read_object(np.int64(1), np.int32(3)).nbytes == p.info.object_bytes
        with pytest.raises(ValueError):
            p.read_object(0, 0, out=np.zeros(10, dtype=np.uint8))
        with pytest.raises(ValueError):
            p.read_object(0, 0, out=np.zeros(p.info.object_bytes, dtype=np.float32))
        with pytest.raises(KeyError):
            p.role("nope")
        with pytest.raises(KeyError):
            p.layer_of(999)


def test_open_refusals(mixtral_pack, tmp_path):
    with pytest.raises(xpack.XpackError) as e:
        xpack.Pack(tmp_path / "absent.xpack")
    assert e.value.errno == 2 and "absent.xpack" in str(e.value)
    assert str(e.value).count("No such file or directory") == 1
    with pytest.raises(xpack.XpackError) as e:
        xpack.Pack(mixtral_pack["gguf"])  # a GGUF given as a pack
    assert e.value.code == xpack.Status.BAD_MAGIC and "xpack-build" in str(e.value)
    with pytest.raises(xpack.XpackError) as e:
        xpack.Pack(tmp_path)
    # Truncated.
    cut = tmp_path / "cut.xpack"
    data = mixtral_pack["pack"].read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(xpack.XpackError):
        xpack.Pack(cut)
    # Another model's trunk.
    other = tmp_path / "other.gguf"
    from conftest import build_dir, run
    run(build_dir() / "tools" / "xpack-synth", "--arch", "mixtral", "--layers", "3", "--experts", "4", "--top-k", "2",
        "--embd", "64", "--ff", "64", "--seed", "9", "-q", "-o", other)
    with pytest.raises(xpack.XpackError) as e:
        xpack.Pack(mixtral_pack["pack"], trunk=other)
    assert e.value.code == xpack.Status.IDENTITY
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        with pytest.raises(xpack.XpackError):
            xpack.Pack(fifo)  # refused, never blocks


def test_damaged_object_raises_checksum_error_naming_it(mixtral_pack, tmp_path):
    bad = tmp_path / "bad.xpack"
    shutil.copyfile(mixtral_pack["pack"], bad)
    with xpack.Pack(bad) as p:
        off = p.object_offset(2, 1) + p.role("up").offset + 5
    with open(bad, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x40]))
    with xpack.Pack(bad) as p:
        p.read_object(2, 0)  # its neighbour is fine
        with pytest.raises(xpack.ChecksumError) as e:
            p.read_object(2, 1)
        assert e.value.code == xpack.Status.OBJECT_CHECKSUM
        p.read_object(2, 1, verify=False)  # the opt-out reads the damaged bytes
        with pytest.raises(xpack.ChecksumError) as e:
            p.validate()
        assert (e.value.block, e.value.expert, e.value.role) == (p.block_of(2), 1, "up")
        p.validate(checksums=False)


def test_concurrent_reads_each_get_their_own_error(mixtral_pack, tmp_path):
    # Threads reading good and damaged objects at once: each failure names its own expert.
    bad = tmp_path / "bad2.xpack"
    shutil.copyfile(mixtral_pack["pack"], bad)
    with xpack.Pack(bad) as p:
        offs = [p.object_offset(0, e) + 100 for e in (1, 3)]
    with open(bad, "r+b") as f:
        for off in offs:
            f.seek(off)
            f.write(b"\xff\xfe")
    errors = []
    with xpack.Pack(bad) as p:
        def worker(e):
            for _ in range(30):
                try:
                    p.read_object(0, e)
                    if e in (1, 3):
                        errors.append(f"expert {e} read as good")
                except xpack.ChecksumError as err:
                    if e not in (1, 3) or f"expert {e}" not in str(err):
                        errors.append(str(err))
        threads = [threading.Thread(target=worker, args=(e,)) for e in range(4) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
