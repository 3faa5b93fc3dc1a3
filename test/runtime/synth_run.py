#!/usr/bin/env python3
"""xpack-run on xpack-synth's models, on the CPU.

For each case, writes the model with xpack-synth, runs a short greedy generation
(prompt 1,5,9,200 and 4 new tokens) from the plain GGUF and, after xpack-build,
from the trunk and the pack with a small expert cache, and requires: exit 0, a
logits file of (prompt + generated) rows of n_vocab, every value finite, rows that
differ (a model whose output ignores its input would pass "finite"), and the pack
run's logits and ids bit-identical to the plain run's; and a text prompt tokenized
into BOS and byte tokens (the synthetic vocabulary's byte fallback).

usage: synth_run.py XPACK_SYNTH XPACK_BUILD XPACK_RUN WORKDIR CASE...
CASE names one of CASES below. Exit 0 pass, 1 fail.
"""
import array
import json
import math
import os
import shutil
import subprocess
import sys

PROMPT = "1,5,9,200"
N_NEW = 4

# name -> xpack-synth arguments, n_vocab
CASES = {
    "oracle-deepseek4": (["--preset", "oracle-deepseek4"], 512),
    "oracle-deepseek4-f32": (["--preset", "oracle-deepseek4", "--f32"], 512),
    "oracle-kimi-k3": (["--preset", "oracle-kimi-k3"], 512),
    "oracle-kimi-k3-f32": (["--preset", "oracle-kimi-k3", "--f32"], 512),
    # The real presets at 2 layers, narrowed where the full model would not fit CI's
    # time: DeepSeek-V4-Flash keeps its whole attention (4096 embd, 64 heads x 512,
    # LoRA ranks, indexer, mHC) with 8 experts 512 wide, one hash layer, then a CSA and
    # an HCA layer; Kimi-K3 keeps 7168 embd, head dims 128, the 3584 latent and top-16,
    # with 16 heads, 16 experts 1024 wide and a 3072-wide dense layer (one KDA dense
    # layer, one MLA MoE layer). Both with a 1024-token vocabulary.
    "deepseek-v4-flash-2": (["--preset", "deepseek-v4-flash", "--layers", "2", "--experts", "8", "--ff", "512",
                             "--vocab", "1024", "--compress-ratios", "4,128", "--hash-layers", "1"], 1024),
    "kimi-k3-2": (["--preset", "kimi-k3", "--layers", "2", "--heads", "16", "--dense-ff", "3072", "--ff", "1024",
                   "--experts", "16", "--vocab", "1024"], 1024),
}


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def read_f32(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a


def check_case(name, synth, build, xrun, work):
    args, n_vocab = CASES[name]
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    model = os.path.join(d, "m.gguf")
    run([synth, "-q", *args, "-o", model])
    run([build, model, "-o", os.path.join(d, "m"), "--force", "--json"])
    results = {}
    for how, src in (("gguf", ["-m", model]),
                     ("pack", ["-m", os.path.join(d, "m.trunk.gguf"), "--pack", os.path.join(d, "m.xpack"),
                               "--cache-mib", "4"])):
        logits = os.path.join(d, f"{how}.f32")
        out = json.loads(run([xrun, *src, "--prompt-ids", PROMPT, "-n", str(N_NEW), "--greedy", "--json",
                              "--logits-out", logits]))
        if out.get("expert_source") != how:
            raise RuntimeError(f"{how} run read its experts from {out.get('expert_source')}")
        results[how] = (out["gen_ids"], read_f32(logits))
    problems = []
    ids, lg = results["gguf"]
    rows = len(PROMPT.split(",")) + N_NEW - 1
    if len(ids) != N_NEW:
        problems.append(f"{len(ids)} tokens generated, {N_NEW} asked")
    if len(lg) % n_vocab or len(lg) // n_vocab < rows:
        problems.append(f"{len(lg)} logits: not at least {rows} rows of {n_vocab}")
    bad = sum(1 for x in lg if not math.isfinite(x))
    if bad:
        problems.append(f"{bad} logits are not finite")
    if len(lg) >= 2 * n_vocab and lg[:n_vocab] == lg[n_vocab:2 * n_vocab]:
        problems.append("the first two rows of logits are identical")
    if results["pack"] != results["gguf"]:
        problems.append(f"pack run differs from the plain run (ids {results['pack'][0]} vs {ids})")
    # Text tokenizes by byte fallback into ids 3..258 (byte b = id 3 + b), after BOS and
    # SentencePiece's spaces as U+2581 (a leading one added).
    text = "Hi, MoE!"
    out = json.loads(run([xrun, "-m", model, "-p", text, "-n", "1", "--json"]))
    pids = out["prompt_ids"]
    want = [1] + [3 + b for b in ("\u2581" + text.replace(" ", "\u2581")).encode()]
    if pids != want:
        problems.append(f"text {text!r} tokenized to {pids}, not {want} (BOS + its bytes)")
    shutil.rmtree(d, ignore_errors=True)
    return problems


def main():
    synth, build, xrun, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    failed = 0
    for name in sys.argv[5:]:
        try:
            problems = check_case(name, synth, build, xrun, work)
        except RuntimeError as e:
            problems = [str(e)]
        print(f"{name}: {'ok' if not problems else 'FAIL'}")
        for p in problems:
            print(f"  FAIL: {p}")
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
