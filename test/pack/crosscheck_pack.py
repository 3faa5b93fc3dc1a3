#!/usr/bin/env python3
"""Independent cross-check of xpack-build output, written from doc/pack-format.md
alone: the pack header and tables are decoded here with `struct`, the source and the
trunk are read with llama.cpp's gguf-py (not our reader), and

  - every (layer, expert, role) at data_start + (slot*n_experts + e)*stride + offset
    equals bytes [e*nbytes, (e+1)*nbytes) of the source tensor,
  - the source identity equals SHA-256 over the shards' metadata sections as the
    document specifies,
  - the trunk holds exactly the non-expert tensors, byte-identical, and the source
    metadata (minus split.*) plus xpack.source_identity / xpack.pack_format_version.

usage: crosscheck_pack.py XPACK_BUILD XPACK_SYNTH SHARED_DIR
exit 77 (skipped) when the gguf package is missing.
"""
import hashlib
import os
import re
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np  # noqa: F401
    import gguf
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: python gguf package not available ({e})")
    sys.exit(1 if os.environ.get("XPACK_REQUIRE_FIXTURES") == "1" else 77)

EXPERT_RE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.weight$")
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL:", msg)


def cstr(b):
    return b.split(b"\0", 1)[0].decode()


def decode_pack(path):
    data = open(path, "rb").read()
    (magic, version, header_bytes, file_size, data_start, stride, object_bytes, alignment, n_layers,
     n_experts, n_used, n_roles, n_shards, role_entry, shard_entry, algo, flags, layer_table, role_table,
     shard_table, checksum_table, index_end) = struct.unpack_from("<8sIIQQQQIIIIIIIIIIQQQQQ", data, 0)
    assert magic == b"XPACK-EP", magic
    assert (version, header_bytes, alignment, role_entry, shard_entry) == (1, 256, 4096, 256, 64)
    assert file_size == len(data) == data_start + n_layers * n_experts * stride
    assert data_start % 4096 == 0 and stride % 4096 == 0
    assert layer_table == 256
    assert role_table == (256 + 4 * n_layers + 7) // 8 * 8
    assert shard_table == role_table + 256 * n_roles
    assert checksum_table == shard_table + 64 * n_shards
    assert index_end == checksum_table + 8 * n_layers * n_experts * (1 + n_roles)
    assert data_start == (index_end + 4095) // 4096 * 4096
    arch = cstr(data[128:192])
    identity = data[192:224]
    layers = list(struct.unpack_from(f"<{n_layers}I", data, layer_table))
    roles = []
    for i in range(n_roles):
        e = role_table + 256 * i
        name = cstr(data[e:e + 16])
        rtype, ndims = struct.unpack_from("<II", data, e + 16)
        ne = struct.unpack_from("<3Q", data, e + 24)
        offset, nbytes = struct.unpack_from("<QQ", data, e + 48)
        pattern = cstr(data[e + 104:e + 200])
        roles.append(dict(name=name, type=rtype, ndims=ndims, ne=ne, offset=offset, nbytes=nbytes, pattern=pattern))
    shards = []
    for i in range(n_shards):
        e = shard_table + 64 * i
        shards.append((data[e:e + 32],) + struct.unpack_from("<QQQ", data, e + 32))
    return dict(data=data, arch=arch, identity=identity, layers=layers, roles=roles, shards=shards,
                n_experts=n_experts, n_used=n_used, stride=stride, data_start=data_start, object_bytes=object_bytes)


def shard_paths(path):
    m = re.match(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", path)
    if not m:
        return [path]
    n = int(m.group(3))
    return [f"{m.group(1)}-{k:05d}-of-{n:05d}.gguf" for k in range(1, n + 1)]


def raw(t):
    return t.data.tobytes()


def check(model, outdir, xpack_build):
    print("checking", model)
    out = os.path.join(outdir, os.path.basename(model) + ".out")
    subprocess.run([xpack_build, model, "-o", out], check=True, stdout=subprocess.DEVNULL)
    pack = decode_pack(out + ".xpack")
    readers = [gguf.GGUFReader(p) for p in shard_paths(model)]
    tensors = {}
    order = []
    for r in readers:
        for t in r.tensors:
            tensors[t.name] = t
            order.append(t.name)

    # Identity, recomputed as the document says.
    h = hashlib.sha256(b"xpack-source-identity-v1")
    for i, (p, r) in enumerate(zip(shard_paths(model), readers)):
        meta = open(p, "rb").read(r.data_offset)
        size = os.path.getsize(p)
        sha = hashlib.sha256(meta).digest()
        if pack["shards"][i] != (sha, r.data_offset, size, len(r.tensors)):
            fail(f"{model}: shard table entry {i} differs")
        h.update(sha + struct.pack("<QQQ", r.data_offset, size, len(r.tensors)))
    if h.digest() != pack["identity"]:
        fail(f"{model}: source identity differs")

    # Experts.
    experts = {n for n in order if EXPERT_RE.match(n)}
    blocks = sorted({int(EXPERT_RE.match(n).group(1)) for n in experts})
    if blocks != pack["layers"]:
        fail(f"{model}: layers {pack['layers']} != {blocks}")
    if {r["name"] for r in pack["roles"]} != {EXPERT_RE.match(n).group(2) for n in experts}:
        fail(f"{model}: role set differs")
    data = pack["data"]
    checked = 0
    for slot, block in enumerate(pack["layers"]):
        for role in pack["roles"]:
            t = tensors[role["pattern"].replace("{block}", str(block))]
            src = raw(t)
            if int(t.tensor_type) != role["type"] or len(src) != role["nbytes"] * pack["n_experts"]:
                fail(f"{t.name}: type/size differs from role {role['name']}")
                continue
            n = role["nbytes"]
            for e in range(pack["n_experts"]):
                off = pack["data_start"] + (slot * pack["n_experts"] + e) * pack["stride"] + role["offset"]
                if data[off:off + n] != src[e * n:(e + 1) * n]:
                    fail(f"{model}: layer {block} expert {e} role {role['name']} differs")
                checked += 1

    # Trunk.
    trunk = gguf.GGUFReader(out + ".trunk.gguf")
    names = [t.name for t in trunk.tensors]
    want = [n for n in order if n not in experts]
    if names != want:
        fail(f"{model}: trunk tensors differ ({len(names)} vs {len(want)})")
    for t in trunk.tensors:
        if raw(t) != raw(tensors[t.name]):
            fail(f"{model}: trunk tensor {t.name} differs")
    src_fields = [f for f in readers[0].fields.values() if not f.name.startswith("split.")
                  and not f.name.startswith("GGUF.")]
    trunk_fields = [f for f in trunk.fields.values() if not f.name.startswith("GGUF.")]
    if [f.name for f in trunk_fields] != [f.name for f in src_fields] + ["xpack.source_identity",
                                                                          "xpack.pack_format_version",
                                                                          "xpack.tensor_xxh3"]:
        fail(f"{model}: trunk metadata keys differ")
    # One checksum per trunk tensor (their values are checked by the C++ round trip,
    # which has xxh3; Python has no xxhash module by default).
    sums = trunk.fields["xpack.tensor_xxh3"]
    if len(sums.data) != len(trunk.tensors):
        fail(f"{model}: xpack.tensor_xxh3 has {len(sums.data)} entries for {len(trunk.tensors)} tensors")
    for a, b in zip(src_fields, trunk_fields):
        if a.types != b.types or [bytes(a.parts[i]) for i in a.data] != [bytes(b.parts[i]) for i in b.data]:
            fail(f"{model}: trunk key {a.name} differs")
    ident = trunk.fields["xpack.source_identity"]
    if bytes(ident.parts[ident.data[0]]).decode() != pack["identity"].hex():
        fail(f"{model}: trunk identity key differs from the pack header")
    print(f"  {checked} role slices, {len(names)} trunk tensors checked")


def main():
    xpack_build, xpack_synth, shared = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as tmp:
        models = []
        synth = os.path.join(tmp, "kimi.gguf")
        subprocess.run([xpack_synth, "-q", "--arch", "kimi-k3", "--layers", "4", "--experts", "8", "--shards", "2",
                        "-o", synth], check=True)
        models.append(os.path.join(tmp, "kimi-00002-of-00002.gguf"))
        synth = os.path.join(tmp, "mix.gguf")
        subprocess.run([xpack_synth, "-q", "--arch", "mixtral", "--layers", "2", "--experts", "4", "--fused-gate-up",
                        "-o", synth], check=True)
        models.append(synth)
        oracle = os.path.join(shared, "oracle", "models")
        if os.path.isdir(oracle):
            models += [os.path.join(oracle, n) for n in ("deepseek4-mxfp4.gguf", "kimi-k3-q2k-q3k.gguf",
                                                          "kimi-k3-q2k-q3k-00001-of-00003.gguf")]
        else:
            print("SKIPPED oracle models: ../shared is absent (synthetic models still checked)")
        for m in models:
            check(m, tmp, xpack_build)
    if failures:
        print(f"{failures} failure(s)")
        sys.exit(1)
    print("all good")


if __name__ == "__main__":
    main()
