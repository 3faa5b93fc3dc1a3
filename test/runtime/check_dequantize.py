#!/usr/bin/env python3
"""Checks gguf_dequantize.py, the reference synth_llama.py builds, on the oracle.

For a quantized oracle model (e.g. deepseek4-mxfp4.gguf) it writes the model's F32
decode with gguf_dequantize.py, runs xpack-run teacher-forced on it (prompt_ids +
gen_ids, -n 0 --logits-out) and compares every row with the oracle's `-deq` logits,
which llama.cpp computed on llama-quantize's own F32 decode: max |diff| <= 1e-3 and
the argmax of each row that predicts a generated id is that id, before the first
position of a tiny route margin (check_oracle.py's rule). So the decode holds the
quantized weights' exact values, in the layout llama.cpp and xpack-run read. Bad
input: a truncated model is refused (non-zero exit, no output file).

usage: check_dequantize.py --xpack-run X --oracle DIR --model FILE --prompt short|long
Exit 0 pass, 1 fail, 77 skipped (no oracle folder, or gguf-py missing).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

# this script's folder is on sys.path
from check_oracle import against_reference, first_fragile_position, same_greedy_ids, skipped

HERE = os.path.dirname(os.path.abspath(__file__))


def dequantize(src, dst):
    return subprocess.run([sys.executable, os.path.join(HERE, "gguf_dequantize.py"), src, dst],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--xpack-run", required=True)
    ap.add_argument("--oracle", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", required=True, choices=["short", "long"])
    args = ap.parse_args()
    model = os.path.join(args.oracle, "models", args.model)
    base = args.model[: -len(".gguf")]
    logits = os.path.join(args.oracle, "logits", f"{base}-deq.{args.prompt}")
    if not os.path.exists(model) or not os.path.exists(logits + ".seq.f32"):
        print(f"SKIPPED: {model} or {logits}.seq.f32 absent")
        return skipped()
    with open(logits + ".json") as f:
        meta = json.load(f)
    with open(logits + ".route.json") as f:
        fragile = first_fragile_position(json.load(f))
    n_vocab = int(meta["n_vocab"])
    ids = list(meta["prompt_ids"]) + list(meta["gen_ids"])
    want = np.fromfile(logits + ".seq.f32", dtype="<f4").reshape(-1, n_vocab)

    with tempfile.TemporaryDirectory(prefix="xpack-deq-") as tmp:
        deq = os.path.join(tmp, "deq.gguf")
        r = dequantize(model, deq)
        if r.returncode == 3:
            print(f"SKIPPED: {r.stderr.strip()}")
            return skipped()
        if r.returncode != 0:
            print(f"gguf_dequantize.py failed ({r.returncode}):\n{r.stdout}{r.stderr}")
            return 1
        print(r.stdout.strip())
        out = os.path.join(tmp, "x.f32")
        x = subprocess.run([args.xpack_run, "-m", deq, "--prompt-ids", ",".join(map(str, ids)), "-n", "0",
                            "--logits-out", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if x.returncode != 0:
            print(f"xpack-run failed ({x.returncode}):\n{x.stderr[-2000:]}")
            return 1
        got = np.fromfile(out, dtype="<f4")

        # Bad input: the first half of the model.
        cut = os.path.join(tmp, "cut.gguf")
        with open(model, "rb") as src, open(cut, "wb") as dst:
            dst.write(src.read(os.path.getsize(model) // 2))
        bad = dequantize(cut, os.path.join(tmp, "cut-deq.gguf"))
        refused = bad.returncode != 0 and not os.path.exists(os.path.join(tmp, "cut-deq.gguf"))

    checked = len(ids) if fragile is None else fragile
    print(f"{args.model} / {args.prompt}, F32 decode against {base}-deq:")
    ok = against_reference("decode", got, want, n_vocab, checked, fragile)
    ok &= same_greedy_ids("decode", got, meta, n_vocab, checked)
    print(f"truncated model: {'refused' if refused else 'NOT refused'} (exit {bad.returncode})")
    ok &= refused
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
