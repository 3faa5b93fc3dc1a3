#!/usr/bin/env python3
"""--prefetch-next measured on xpack-synth models (random weights), on the CPU.

For each model (deepseek4 and kimi-k3 with the routing shape of synth_skew.py,
256 experts top-6 or top-8, narrow otherwise; the Mixtral-form llama fixture
with 8 experts top-2), with and without --router-skew, samples tokens with a
fixed seed from the Expert Pack through a cache of 14.6 % of the pack's experts
(the seed's cache-to-pack ratio), with --prefetch-next N for a few N and both
guess states, and prints what xpack-run counts: accuracy (guessed experts the
layer then used / guessed) and recall (used / routed). Beside them, from the
routing trace of the same run, two guesses that need no router: the guessed
layer's experts of the previous step (temporal reuse), and its N most used
experts so far (popularity). And the cache's misses with and without guesses
(the routing, hence the demand, is the same). The guesses are counted over the
decode steps (the totals minus the prompt's), the two baselines over decode
steps 2 and later.

Prints the table doc/xpack-run.md holds; checks nothing.
usage: next_prefetch_report.py XPACK_SYNTH XPACK_BUILD XPACK_RUN WORKDIR [--tokens N]
"""
import csv
import json
import os
import shutil
import subprocess
import sys
from collections import Counter, defaultdict

PROMPT = "1,5,9,200,33,71"
CACHE_FRACTION = 0.146

MODELS = {
    # name: (xpack-synth arguments, layers, experts, top-k, the layers whose experts are guessed)
    "deepseek4": (["--arch", "deepseek4", "--layers", "4", "--hash-layers", "1", "--embd", "256", "--heads", "4",
                   "--experts", "256", "--top-k", "6", "--ff", "64", "--vocab", "512"], 4, 256, 6, [1, 2, 3]),
    "kimi-k3": (["--arch", "kimi-k3", "--layers", "4", "--dense-layers", "1", "--embd", "256", "--heads", "4",
                 "--experts", "256", "--top-k", "8", "--ff", "256", "--vocab", "512"], 4, 256, 8, [2, 3]),
    "mixtral": (["--arch", "mixtral", "--layers", "4", "--embd", "256", "--heads", "4", "--experts", "8",
                 "--top-k", "2", "--ff", "256", "--vocab", "512"], 4, 8, 2, [1, 2, 3]),
}


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    if r.returncode != 0:
        raise RuntimeError(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def read_trace(path):
    """layer -> step -> set of experts."""
    steps = defaultdict(lambda: defaultdict(set))
    with open(path) as f:
        rows = csv.reader(f)
        next(rows)
        for s, l, e in rows:
            steps[int(l)][int(s)].add(int(e))
    return steps


def baselines(trace, guessed_layers, n):
    """(accuracy, recall) of the previous step's experts and of the n most used so far (decode steps 2..)."""
    prev_u = prev_i = prev_r = pop_u = pop_i = pop_r = 0
    for layer in guessed_layers:
        by_step = trace[layer]
        count = Counter()
        for s in sorted(by_step):
            cur = by_step[s]
            if s >= 2:
                prev = by_step[s - 1]
                prev_u += len(prev & cur)
                prev_i += len(prev)
                prev_r += len(cur)
                pop = {e for e, _ in sorted(count.items(), key=lambda t: (-t[1], t[0]))[:n]}
                pop_u += len(pop & cur)
                pop_i += len(pop)
                pop_r += len(cur)
            count.update(cur)
    return (prev_u / prev_i, prev_u / prev_r), (pop_u / pop_i, pop_u / pop_r)


def main():
    synth, build, xrun, work = sys.argv[1:5]
    rest = sys.argv[5:]
    tokens = int(rest[rest.index("--tokens") + 1]) if "--tokens" in rest else 64
    os.makedirs(work, exist_ok=True)
    print(f"{tokens} sampled tokens (--temp 1 --seed 7) after a {len(PROMPT.split(','))}-token prompt; "
          f"cache {CACHE_FRACTION:.1%} of the pack's experts; random weights, not a trained router")
    print("| model | skew | N | state | accuracy | recall | prev. step: acc. / recall | popular N: acc. / recall "
          "| cache misses (no guess) | objects read (no guess) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, (args, layers, n_expert, top_k, guessed) in MODELS.items():
        for skew in ([None, 0.7] if name != "mixtral" else [None]):
            d = os.path.join(work, f"{name}-{skew}")
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            gguf = os.path.join(d, "m.gguf")
            run([synth, "-q", *args, *([] if skew is None else ["--router-skew", str(skew)]), "-o", gguf])
            run([build, gguf, "-o", os.path.join(d, "m"), "--force"])
            base = ["-m", os.path.join(d, "m.trunk.gguf"), "--pack", os.path.join(d, "m.xpack"), "--prompt-ids",
                    PROMPT, "-n", str(tokens), "--ignore-eos", "--temp", "1", "--seed", "7", "-t", "2", "--json",
                    "--allow-buffered-io"]
            first = json.loads(run([xrun, *base]))["counters"]
            objects = first["object_bytes"]
            moe_layers = layers - (1 if name == "kimi-k3" else 0)  # its one dense lead layer
            cap_objects = max(top_k + 1, round(CACHE_FRACTION * moe_layers * n_expert))
            cache = ["--cache-mib", f"{cap_objects * ((objects + 4095) // 4096 * 4096) / 1048576.0:.6f}"]
            trace_path = os.path.join(d, "trace.csv")
            off = json.loads(run([xrun, *base, *cache, "--trace", trace_path]))["counters"]
            trace = read_trace(trace_path)
            for n in sorted({max(1, top_k // 2), top_k, 2 * top_k} - {0}):
                if n > n_expert:
                    continue
                (pa, pr), (qa, qr) = baselines(trace, guessed, n)
                for state in ("moe-input", "renormed"):
                    out = json.loads(run([xrun, *base, *cache, "--prefetch-next", str(n), "--prefetch-next-from",
                                          state]))
                    c, p = out["counters"], out["counters_prefill"]
                    # Decode steps only: the totals minus the prompt's.
                    used = c["next_guess_used"] - p["next_guess_used"]
                    acc = used / (c["next_guess_issued"] - p["next_guess_issued"])
                    rec = used / (c["next_guess_routed"] - p["next_guess_routed"])
                    print(f"| {name} | {'none' if skew is None else skew} | {n} | {state} | "
                          f"{acc:.3f} | {rec:.3f} | {pa:.3f} / {pr:.3f} | "
                          f"{qa:.3f} / {qr:.3f} | {c['cache_misses']} ({off['cache_misses']}) | "
                          f"{c['pack_reads']} ({off['pack_reads']}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
