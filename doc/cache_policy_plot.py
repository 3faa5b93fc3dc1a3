#!/usr/bin/env python3
"""Hit rate vs cache capacity per eviction policy, from xpack-sim.

Replays a routing trace recorded by `xpack-run --trace` (--trace), or generates
a synthetic one, runs `xpack-sim --json` at each capacity and plots hit rate per
policy into a PNG. doc/cache-policy.png comes from a recorded trace; the
command lines are in doc/cache.md.

The synthetic trace imitates DeepSeek-V4-Flash decode (43 MoE layers x 256
experts, top-6): per layer a Zipf-skewed expert popularity, temporal locality
(each routed expert of a token repeats one of the previous token's experts of
that layer with probability --reuse), a slow drift of the popularity ranking
(prompt-domain shift), and per request one prefill step of --prefill tokens
before --decode decode tokens. It is NOT a recorded trace; see doc/cache.md.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import textwrap


def synth_trace(path, layers, experts, top_k, requests, prefill, decode, zipf_s, reuse,
                drift, seed):
    rng = random.Random(seed)
    weights = [1.0 / (r + 1) ** zipf_s for r in range(experts)]
    # rank -> expert id, per layer
    order = []
    for _ in range(layers):
        ids = list(range(experts))
        rng.shuffle(ids)
        order.append(ids)
    prev = [[] for _ in range(layers)]

    def route(layer):
        chosen = []
        while len(chosen) < top_k:
            if prev[layer] and rng.random() < reuse:
                e = rng.choice(prev[layer])
            else:
                e = order[layer][rng.choices(range(experts), weights)[0]]
            if e not in chosen:
                chosen.append(e)
        prev[layer] = chosen
        return chosen

    def drift_step():
        for layer in range(layers):
            for _ in range(drift):
                i, j = rng.randrange(experts), rng.randrange(experts)
                order[layer][i], order[layer][j] = order[layer][j], order[layer][i]

    step = 0
    with open(path, "w") as f:
        f.write("step,layer,expert\n")
        for _ in range(requests):
            # prefill: all tokens of the prompt in one step per layer
            for layer in range(layers):
                for _t in range(prefill):
                    for e in route(layer):
                        f.write(f"{step},{layer},{e}\n")
            step += 1
            for _t in range(decode):
                for layer in range(layers):
                    for e in route(layer):
                        f.write(f"{step},{layer},{e}\n")
                step += 1
                drift_step()
            # a new prompt: shift the hot set more
            for _ in range(10):
                drift_step()


def trace_extent(path):
    """(smallest (step, layer) group, distinct (layer, expert) keys) of a trace."""
    keys, groups, last = set(), [], None
    with open(path) as f:
        next(f)
        for line in f:
            step, layer, expert = (int(x) for x in line.split(","))
            keys.add((layer, expert))
            if (step, layer) != last:
                groups.append(0)
                last = (step, layer)
            groups[-1] += 1
    return min(groups), len(keys)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sim", required=True, help="path of the xpack-sim binary")
    ap.add_argument("--trace", help="a recorded trace (xpack-run --trace) instead of a synthetic one")
    ap.add_argument("--label", help="what produced --trace, for the plot title")
    ap.add_argument("--save-trace", help="where to write the synthetic trace")
    ap.add_argument("--out", default="cache-policy.png")
    ap.add_argument("--json-out", help="also write the raw results here")
    ap.add_argument("--capacities",
                    help="comma-separated slot counts (default: synthetic 64..8192; for --trace, "
                         "12 steps from the smallest group to every distinct (layer, expert))")
    ap.add_argument("--layers", type=int, default=43)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--top-k", type=int,
                    help="routed experts per token (synthetic default 6; for --trace xpack-sim infers it)")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--prefill", type=int, default=32)
    ap.add_argument("--decode", type=int, default=200)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--reuse", type=float, default=0.35)
    ap.add_argument("--drift", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    trace = a.trace
    if not trace:
        if a.top_k is None:
            a.top_k = 6
        trace = a.save_trace or "synthetic-trace.csv"
        synth_trace(trace, a.layers, a.experts, a.top_k, a.requests, a.prefill, a.decode,
                    a.zipf, a.reuse, a.drift, a.seed)
    if a.capacities:
        caps = [int(c) for c in a.capacities.split(",")]
    elif a.trace:
        smallest, n_keys = trace_extent(trace)
        caps = sorted({round(smallest * (n_keys / smallest) ** (i / 11)) for i in range(12)})
    else:
        caps = [64, 128, 256, 512, 1024, 1686, 2048, 3072, 4096, 6144, 8192]
    results = {}
    for cap in caps:
        cmd = [a.sim, "--trace", trace, "--capacity", str(cap), "--json"]
        if a.top_k is not None:
            cmd += ["--top-k", str(a.top_k)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        for name, r in json.loads(out.stdout)["policies"].items():
            results.setdefault(name, []).append((cap, r["hit_rate"], r["hits"], r["misses"]))
        print(cap, {n: round(v[-1][1], 4) for n, v in results.items()}, flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"trace": os.path.basename(trace), "results": results}, f, indent=1)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"lru": "o-", "lfu": "s-", "hybrid": "^-", "belady": "k--"}
    for name, pts in results.items():
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], styles.get(name, "x-"), label=name)
    ax.set_xscale("log", base=2)
    if a.trace:
        # few, small capacities: label each one with its slot count
        ax.set_xticks(caps)
        ax.set_xticklabels([str(c) for c in caps])
    ax.set_xlabel("cache capacity (expert slots, shared by all layers)")
    ax.set_ylabel("hit rate (%)")
    title = "xpack-sim: hit rate vs capacity"
    if a.trace:
        title += "\n" + textwrap.fill("recorded trace: " + (a.label or os.path.basename(a.trace)), 90)
    else:
        title += (f"\nsynthetic trace: {a.layers} layers x {a.experts} experts, top-{a.top_k}, "
                  f"Zipf s={a.zipf}, reuse {a.reuse}")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print("wrote", a.out)


if __name__ == "__main__":
    sys.exit(main())
