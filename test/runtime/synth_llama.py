#!/usr/bin/env python3
"""llama.cpp and xpack-run on xpack-synth's models: the same logits.

For each CASE (a name of synth_run.py's CASES: the real presets at 2 layers,
narrowed as CI runs them, and the oracle presets):

 1. writes the model with xpack-synth, and its decode to F32 (gguf_dequantize.py:
    the exact values its quantized weights stand for);
 2. runs llama.cpp (llama_logits, CPU, ../shared/oracle's settings) on the decoded
    model: the prompt one token per call, then N greedy tokens. That is the
    reference, as ../shared/oracle's `-deq` logits are. It also runs llama.cpp on the
    quantized model itself, where its matmuls first round the activations to
    Q8_0/Q8_K: that run is reported, not held to the tolerance;
 3. runs xpack-run teacher-forced on prompt + the reference's greedy ids (-n 0
    --logits-out), on the quantized model and on the decoded one;
 4. requires of both xpack-run runs every row within 1e-3 of the reference and
    greedy ids identical (each row that predicts a generated id has it as argmax).

llama_logits does not report routing margins, so a row where a tiny numeric
difference picks another expert would fail here: the output names the first such
row, to be judged (../shared/oracle/MANIFEST.md, "How to compare a runtime").

usage: synth_llama.py --llama-logits BIN --xpack-synth S --xpack-run R --work DIR
                      [--prompt short|long] [--gen N] [--threads T] [--oracle DIR] CASE...
BIN: test/runtime/build_llama_logits.sh's program. Exit 0 pass, 1 fail, 2 usage.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

from synth_run import CASES  # this script's folder is on sys.path

TOL = 1e-3
HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def llama(args, model, ids_file, out):
    run([args.llama_logits, "-m", model, "--ids", ids_file, "-n", str(args.gen), "-t", str(args.threads), "-o", out])
    with open(out + ".json") as f:
        meta = json.load(f)
    logits = np.fromfile(out + ".f32", dtype="<f4").reshape(-1, int(meta["n_vocab"]))
    return meta, logits


def xpack(args, model, ids, n_vocab, out):
    run([args.xpack_run, "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", "0", "--logits-out", out,
         "--threads", str(args.threads)])
    return np.fromfile(out, dtype="<f4").reshape(-1, n_vocab)


def compare(label, got, want, meta, held, own_gen=None):
    """Prints one line; returns False if held to the tolerance and out of it.

    own_gen: the ids a free-running run fed back itself; its rows are compared
    only while they are the reference's ids (after that they follow other tokens).
    """
    if got.shape != want.shape:
        print(f"  {label}: shape {got.shape}, expected {want.shape}")
        return not held
    first = len(meta["prompt_ids"]) - 1
    gen = meta["gen_ids"]
    picks = got.argmax(axis=1)
    same = sum(int(picks[first + i]) == int(g) for i, g in enumerate(gen))
    if own_gen is not None:
        agree = next((i for i, (a, b) in enumerate(zip(own_gen, gen)) if a != b), len(gen))
        got, want = got[:first + 1 + agree], want[:first + 1 + agree]
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max(axis=1)
    over = [r for r in range(len(diff)) if not diff[r] <= TOL]
    line = (f"  {label}: max |diff| {diff.max():.3g} over {len(diff)} rows, {len(diff) - len(over)} within {TOL}; "
            f"greedy ids {same} of {len(gen)}")
    if over:
        line += f"; first row over {over[0]} (|diff| {diff[over[0]]:.3g})"
    print(line)
    return not held or (not over and same == len(gen))


def check(args, name):
    synth_args, n_vocab = CASES[name]
    work = os.path.join(args.work, name)
    os.makedirs(work, exist_ok=True)
    quant, deq = os.path.join(work, "m.gguf"), os.path.join(work, "m-deq.gguf")
    run([args.xpack_synth, "-q"] + synth_args + ["-o", quant])
    run([sys.executable, os.path.join(HERE, "gguf_dequantize.py"), quant, deq])
    ids_file = os.path.join(args.oracle, "prompts", args.prompt + ".ids")
    meta, want = llama(args, deq, ids_file, os.path.join(work, "llama-deq"))
    quant_meta, llama_quant = llama(args, quant, ids_file, os.path.join(work, "llama-quant"))
    if int(meta["n_vocab"]) != n_vocab:
        print(f"  llama.cpp reports n_vocab {meta['n_vocab']}, the case {n_vocab}")
        return False
    ids = list(meta["prompt_ids"]) + list(meta["gen_ids"])
    print(f"{name} / {args.prompt}: {os.path.getsize(quant) / 1e6:.0f} MB ({' '.join(synth_args)}), "
          f"{len(ids)} rows; reference llama.cpp on the F32 decode")
    ok = compare("xpack-run, quantized model", xpack(args, quant, ids, n_vocab, os.path.join(work, "x.f32")),
                 want, meta, True)
    ok &= compare("xpack-run, F32 decode", xpack(args, deq, ids, n_vocab, os.path.join(work, "x-deq.f32")),
                  want, meta, True)
    compare("llama.cpp, quantized model (activations rounded; not held)", llama_quant, want, meta, False,
            quant_meta["gen_ids"])
    print("PASS" if ok else "FAIL")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-logits", required=True)
    ap.add_argument("--xpack-synth", required=True)
    ap.add_argument("--xpack-run", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--prompt", choices=["short", "long"], default="short")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--oracle", default=os.path.join(HERE, "..", "..", "..", "shared", "oracle"))
    ap.add_argument("cases", nargs="+", metavar="CASE")
    args = ap.parse_args()
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case {unknown[0]}; cases: {', '.join(CASES)}")
    for prog in (args.llama_logits, args.xpack_synth, args.xpack_run):
        if not os.access(prog, os.X_OK):
            ap.error(f"{prog}: not an executable (llama_logits: test/runtime/build_llama_logits.sh builds it)")
    ok = True
    for name in args.cases:
        try:
            ok &= check(args, name)
        except (RuntimeError, OSError) as e:
            print(f"{name}: {e}")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
