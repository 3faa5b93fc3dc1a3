#!/usr/bin/env python3
"""xpack-synth --router-skew, measured where it acts: in xpack-run's router, on the CPU.

Writes a small deepseek4 model (real routing shape: 256 experts, top-6; one hash
layer then learned routers; narrow otherwise) for each Zipf exponent A, builds its
pack, generates tokens with xpack-run --trace, and measures from the trace, per
layer: the share of routes taken by the top 10 % of experts, the Zipf exponent
fitted to the measured popularity (maximum likelihood over the empirical ranks),
and the share of a step's experts already used at the step before (temporal
reuse); then xpack-sim replays the trace with a cache of 14.6 % of the pack's
experts (the seed's cache-to-pack ratio) under LRU and hybrid.

Beside each model it puts the same statistics for independent tokens routed as
the skew model assumes (random router logits of the right spread, the same bias),
so what the model's own hidden states add (or take away) is visible.

Test mode (default) checks, for A = 0 and A = 1.2, that the skew is real: with
A = 1.2 the top 10 % of experts take at least half of the routes in every layer
(uniform: 10 %), the fitted exponent is within 0.3 of the independent tokens' and
0.3 above A = 0's, and the hybrid hit rate rises by at least 0.2 over A = 0; with
A = 0 no learned layer's top 10 % takes more than 0.36 (twice what sampling alone
gives uniform routing over these few tokens, 0.18: the rest is the random router's
own concentration, doc/xpack-synth.md); and the flag's bad values are refused.
--report A,A,...: prints the table doc/xpack-synth.md holds and checks nothing.

usage: synth_skew.py XPACK_SYNTH XPACK_BUILD XPACK_RUN XPACK_SIM WORKDIR [--report A,...] [--tokens N]
Exit 0 pass, 1 fail.
"""
import csv
import json
import math
import os
import random
import shutil
import subprocess
import sys
from collections import Counter, defaultdict

N_EXPERT, TOP_K, LAYERS, HASH_LAYERS, EMBD = 256, 6, 4, 1, 256
MODEL = ["--arch", "deepseek4", "--layers", str(LAYERS), "--embd", str(EMBD), "--heads", "4", "--experts",
         str(N_EXPERT), "--top-k", str(TOP_K), "--ff", "64", "--vocab", "512", "--hash-layers", str(HASH_LAYERS)]
PROMPT = "1,5,9,200,33,71"
CACHE_FRACTION = 0.146  # the seed: a 21 GiB expert cache for a 147 GB pack


def run(cmd, ok=(0,)):
    # errors="replace": a random model generates byte tokens, not always UTF-8 text
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    if r.returncode not in ok:
        raise RuntimeError(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r


def mean_log_rank(a, n):
    h = m = 0.0
    for r in range(1, n + 1):
        w = r ** -a
        h += w
        m += w * math.log(r)
    return m / h


def fit_zipf(counts, n):
    """Maximum-likelihood Zipf exponent over ranks 1..n for the counts sorted descending."""
    c = sorted(counts, reverse=True) + [0] * (n - len(counts))
    total = sum(c)
    target = sum(ci * math.log(i + 1) for i, ci in enumerate(c)) / total
    lo, hi = -8.0, 8.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if mean_log_rank(mid, n) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def read_trace(path):
    """layer -> step -> set of experts; step 0 (the prompt) left out."""
    steps = defaultdict(lambda: defaultdict(set))
    with open(path) as f:
        rows = csv.reader(f)
        if next(rows) != ["step", "layer", "expert"]:
            raise RuntimeError(f"{path}: not a routing trace")
        for s, l, e in rows:
            if int(s) > 0:
                steps[int(l)][int(s)].add(int(e))
    return steps


def layer_stats(by_step):
    count = Counter()
    reuse, prev = [], None
    for s in sorted(by_step):
        for e in by_step[s]:
            count[e] += 1
        if prev is not None:
            reuse.append(len(by_step[s] & prev) / len(by_step[s]))
        prev = by_step[s]
    c = sorted(count.values(), reverse=True)
    top = sum(c[: round(N_EXPERT * 0.1)]) / sum(c)
    return {"top10": top, "zipf": fit_zipf(c, N_EXPERT), "reuse": sum(reuse) / len(reuse)}


def simulate(path, hit_rate_cap):
    out = json.loads(run([SIM, "--trace", path, "--capacity", str(hit_rate_cap), "--policy", "lru,hybrid",
                          "--json"]).stdout)
    return {p: out["policies"][p]["hit_rate"] for p in ("lru", "hybrid")}


def independent_trace(path, a, beta, steps, seed):
    """Independent tokens routed as the skew model assumes (tools/synth_skew.h): per
    token, router logits N(0, embd / 768) over the experts, sqrt(softplus) gating,
    plus the bias beta ln (r + 1)^-a, top-k. The model's own runs differ from this by
    what its hidden states add: correlation from token to token."""
    rng = random.Random(seed)
    sigma = math.sqrt(EMBD / 768)
    bias = [-beta * a * math.log(r + 1) for r in range(N_EXPERT)]
    with open(path, "w") as f:
        f.write("step,layer,expert\n")
        for s in range(1, steps + 1):
            for layer in range(LAYERS):
                v = []
                for e in range(N_EXPERT):
                    z = rng.gauss(0.0, sigma)
                    v.append((math.sqrt(z if z > 20 else math.log1p(math.exp(z))) + bias[e], e))
                v.sort(key=lambda t: (-t[0], t[1]))
                f.writelines(f"{s},{layer},{e}\n" for _, e in v[:TOP_K])


def measure(work, a, tokens):
    """Generates, runs and measures one model; a is None for no --router-skew."""
    name = "none" if a is None else f"a{a}"
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    gguf = os.path.join(d, "m.gguf")
    out = run([SYNTH, *MODEL, *([] if a is None else ["--router-skew", str(a)]), "-o", gguf]).stdout
    beta = float(out.split("exp_probs_b = ")[1].split()[0]) if a is not None else 0.0
    run([BUILD, gguf, "-o", os.path.join(d, "m")])
    trace = os.path.join(d, "trace.csv")
    # Sampling (fixed seed) rather than greedy: a random model's greedy output falls
    # into short loops, which would repeat the hash layer's experts step after step.
    run([XRUN, "-m", os.path.join(d, "m.trunk.gguf"), "--pack", os.path.join(d, "m.xpack"), "--prompt-ids", PROMPT,
         "-n", str(tokens), "--ignore-eos", "--temp", "1", "--seed", "7", "-t", "1", "--trace", trace,
         "--allow-buffered-io"])
    steps = read_trace(trace)
    if sorted(steps) != list(range(LAYERS)) or any(len(steps[l]) != tokens for l in steps):
        raise RuntimeError(f"{trace}: expected {LAYERS} layers x {tokens} steps")
    cap = round(CACHE_FRACTION * LAYERS * N_EXPERT)
    res = {"layers": [layer_stats(steps[l]) for l in range(LAYERS)], "hit": simulate(trace, cap), "cap": cap}
    ind = os.path.join(d, "independent.csv")
    independent_trace(ind, 0.0 if a is None else a, beta, tokens, 11)
    isteps = read_trace(ind)
    res["ind_layers"] = [layer_stats(isteps[l]) for l in range(LAYERS)]
    res["ind_hit"] = simulate(ind, cap)
    return res


def report(work, values, tokens):
    print(f"deepseek4 {LAYERS} layers ({HASH_LAYERS} hash-routed), {N_EXPERT} experts top-{TOP_K}, "
          f"{tokens} sampled tokens; cache {round(CACHE_FRACTION * LAYERS * N_EXPERT)} experts "
          f"({CACHE_FRACTION:.1%} of the pack); random weights, not a trained router")
    print("| A | layer | top 10 % share | fitted Zipf | reuse | independent: top 10 % / Zipf / reuse |")
    print("|---|---|---|---|---|---|")
    hits = []
    for a in values:
        r = measure(work, a, tokens)
        for l, (m, i) in enumerate(zip(r["layers"], r["ind_layers"])):
            kind = "hash" if l < HASH_LAYERS else "learned"
            print(f"| {'none' if a is None else a} | {l} ({kind}) | {m['top10']:.2f} | {m['zipf']:.2f} | "
                  f"{m['reuse']:.2f} | {i['top10']:.2f} / {i['zipf']:.2f} / {i['reuse']:.2f} |")
        hits.append((a, r["hit"], r["ind_hit"]))
    print("\n| A | LRU hit rate | hybrid hit rate | independent tokens: LRU / hybrid |")
    print("|---|---|---|---|")
    for a, h, i in hits:
        print(f"| {'none' if a is None else a} | {h['lru']:.3f} | {h['hybrid']:.3f} | {i['lru']:.3f} / {i['hybrid']:.3f} |")
    return 0


def check_refused(failures):
    for bad in (["--router-skew", "-1"], ["--router-skew", "nan"], ["--router-skew", "5"], ["--router-skew", "x"],
                ["--router-skew"]):
        r = run([SYNTH, *MODEL, *bad, "-o", os.path.join(WORK, "bad.gguf")], ok=(0, 1, 2))
        if r.returncode != 2:
            failures.append(f"{' '.join(bad)}: exit {r.returncode}, expected 2 (usage error)")
    r = run([SYNTH, "--arch", "mixtral", "--router-skew", "1", "-o", os.path.join(WORK, "bad.gguf")], ok=(0, 1, 2))
    if r.returncode != 2 or "router-skew" not in r.stderr:
        failures.append(f"mixtral --router-skew: exit {r.returncode} ({r.stderr.strip()}), expected 2")


def test(work, tokens):
    failures = []
    check_refused(failures)
    flat, skew = measure(work, 0.0, tokens), measure(work, 1.2, tokens)
    uniform = round(N_EXPERT * 0.1) / N_EXPERT
    for l in range(LAYERS):
        f, s, i = flat["layers"][l], skew["layers"][l], skew["ind_layers"][l]
        print(f"layer {l}: top 10 % share A=0 {f['top10']:.3f}, A=1.2 {s['top10']:.3f} (uniform {uniform:.3f}); "
              f"fitted Zipf A=0 {f['zipf']:.2f}, A=1.2 {s['zipf']:.2f} (independent tokens {i['zipf']:.2f})")
        if s["top10"] < 0.5:
            failures.append(f"layer {l}: A=1.2 top 10 % share {s['top10']:.3f} < 0.5")
        if l >= HASH_LAYERS and f["top10"] > 0.36:
            failures.append(f"layer {l}: A=0 top 10 % share {f['top10']:.3f} > 0.36")
        if s["zipf"] < f["zipf"] + 0.3:
            failures.append(f"layer {l}: fitted exponent {s['zipf']:.2f} at A=1.2 not 0.3 above A=0's {f['zipf']:.2f}")
        if abs(s["zipf"] - i["zipf"]) > 0.3:
            failures.append(f"layer {l}: fitted exponent {s['zipf']:.2f} at A=1.2, independent tokens {i['zipf']:.2f}")
    print(f"hybrid hit rate at {flat['cap']} of {LAYERS * N_EXPERT} experts: A=0 {flat['hit']['hybrid']:.3f}, "
          f"A=1.2 {skew['hit']['hybrid']:.3f}")
    if skew["hit"]["hybrid"] < flat["hit"]["hybrid"] + 0.2:
        failures.append("hybrid hit rate does not rise by 0.2 from A=0 to A=1.2")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    SYNTH, BUILD, XRUN, SIM, WORK = sys.argv[1:6]
    rest = sys.argv[6:]
    n_tokens = int(rest[rest.index("--tokens") + 1]) if "--tokens" in rest else 256
    os.makedirs(WORK, exist_ok=True)
    if "--report" in rest:
        vals = [None if v == "none" else float(v) for v in rest[rest.index("--report") + 1].split(",")]
        sys.exit(report(WORK, vals, n_tokens))
    sys.exit(test(WORK, n_tokens))
