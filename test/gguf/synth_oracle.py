#!/usr/bin/env python3
"""xpack-synth at the oracle models' own dims against the oracle models.

For each oracle model in ORACLE/models (written by llama.cpp's gguf-py and
llama-quantize / llama-gguf-split), writes the matching xpack-synth file
(--preset oracle-deepseek4 / oracle-kimi-k3, --f32 for the F32 models, --shards 3
for the split set) and compares, reading both with gguf-py (not our reader):

  - the metadata key sets, each key's value type (and array element type), and
    the values of every architecture key, general.file_type,
    general.quantization_version, split.* and the tokenizer's special ids
    (general.name, general.description and the vocabulary's strings and scores
    may differ; the vocabulary's length may not);
  - the tensor sets: name, ne (with its number of dims) and ggml type.

Every difference is printed on its own line; any makes the test fail. The
comparison is also run once on a pair that differs (the F32 oracle against the
quantized synthetic file) and must report differences there, so a comparison
that sees nothing fails too.

usage: synth_oracle.py XPACK_SYNTH SHARED_DIR
exit 0 pass, 1 fail, 77 skipped (no gguf package or no ../shared/oracle; a
failure under XPACK_REQUIRE_FIXTURES=1, as in CI).
"""
import os
import subprocess
import sys
import tempfile


def skip(why):
    print(f"SKIPPED: {why}")
    sys.exit(1 if os.environ.get("XPACK_REQUIRE_FIXTURES") == "1" else 77)


try:
    import numpy as np  # noqa: F401
    import gguf
except ImportError as e:  # pragma: no cover
    skip(f"python gguf package not available ({e})")

IGNORED_VALUES = {"general.name", "general.description", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                  "tokenizer.ggml.token_type", "tokenizer.ggml.model"}


def field_type(f):
    t = [gguf.GGUFValueType(x).name for x in f.types]
    return "/".join(t)


def field_value(f):
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode() for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    return f.parts[f.data[0]].tolist()[0]


def describe(path):
    r = gguf.GGUFReader(path)
    keys = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: ([int(x) for x in t.shape], t.tensor_type.name) for t in r.tensors}
    return keys, tensors


def compare(ours_path, ref_path):
    """The list of differences between two GGUF files, one line each."""
    ours_k, ours_t = describe(ours_path)
    ref_k, ref_t = describe(ref_path)
    arch = field_value(ref_k["general.architecture"]) if "general.architecture" in ref_k else None
    diffs = []
    for k in sorted(ref_k.keys() - ours_k.keys()):
        diffs.append(f"key {k} missing (oracle: {field_type(ref_k[k])} {field_value(ref_k[k])!r:.80})")
    for k in sorted(ours_k.keys() - ref_k.keys()):
        diffs.append(f"key {k} is extra ({field_type(ours_k[k])} {field_value(ours_k[k])!r:.80})")
    for k in sorted(ours_k.keys() & ref_k.keys()):
        a, b = ours_k[k], ref_k[k]
        if field_type(a) != field_type(b):
            diffs.append(f"key {k}: type {field_type(a)}, oracle {field_type(b)}")
            continue
        va, vb = field_value(a), field_value(b)
        if k in IGNORED_VALUES:
            if isinstance(vb, list) and len(va) != len(vb):
                diffs.append(f"key {k}: {len(va)} elements, oracle {len(vb)}")
            continue
        if va != vb and (arch is None or k.startswith(arch + ".") or k.startswith("general.")
                         or k.startswith("split.") or k.startswith("tokenizer.")):
            diffs.append(f"key {k}: {va!r:.80}, oracle {vb!r:.80}")
    for n in sorted(ref_t.keys() - ours_t.keys()):
        diffs.append(f"tensor {n} missing (oracle: ne {ref_t[n][0]} {ref_t[n][1]})")
    for n in sorted(ours_t.keys() - ref_t.keys()):
        diffs.append(f"tensor {n} is extra (ne {ours_t[n][0]} {ours_t[n][1]})")
    for n in sorted(ours_t.keys() & ref_t.keys()):
        if ours_t[n] != ref_t[n]:
            diffs.append(f"tensor {n}: ne {ours_t[n][0]} {ours_t[n][1]}, oracle ne {ref_t[n][0]} {ref_t[n][1]}")
    return diffs


def main():
    synth, shared = sys.argv[1:3]
    models = os.path.join(shared, "oracle", "models")
    if not os.path.isdir(models):
        skip(f"{models} is absent")
    cases = [
        ("oracle-deepseek4", ["--f32"], "deepseek4-f32.gguf"),
        ("oracle-deepseek4", [], "deepseek4-mxfp4.gguf"),
        ("oracle-kimi-k3", ["--f32"], "kimi-k3-f32.gguf"),
        ("oracle-kimi-k3", [], "kimi-k3-q2k-q3k.gguf"),
    ]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        pairs = []
        for preset, flags, ref in cases:
            out = os.path.join(tmp, f"{preset}{''.join(flags)}.gguf")
            subprocess.run([synth, "-q", "--preset", preset, *flags, "-o", out], check=True)
            pairs.append((out, ref))
        split = os.path.join(tmp, "kimi-split.gguf")
        subprocess.run([synth, "-q", "--preset", "oracle-kimi-k3", "--shards", "3", "-o", split], check=True)
        for k in (1, 2, 3):
            pairs.append((os.path.join(tmp, f"kimi-split-{k:05d}-of-00003.gguf"),
                          f"kimi-k3-q2k-q3k-{k:05d}-of-00003.gguf"))
        for ours, ref in pairs:
            diffs = compare(ours, os.path.join(models, ref))
            print(f"{os.path.basename(ours)} vs {ref}: {len(diffs)} differences")
            for d in diffs:
                print(f"  FAIL: {d}")
            failures += bool(diffs)
        # The comparison must see a difference where there is one.
        diffs = compare(pairs[1][0], os.path.join(models, "deepseek4-f32.gguf"))
        print(f"control: quantized synthetic vs deepseek4-f32.gguf: {len(diffs)} differences (must be > 0)")
        if not any("MXFP4" in d for d in diffs) or not any("general.quantization_version" in d for d in diffs):
            print("  FAIL: the comparison missed the expert types or the quantization key")
            failures += 1
    print("PASS" if failures == 0 else f"FAIL: {failures} comparisons differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
