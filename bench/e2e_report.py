#!/usr/bin/env python3
"""The end-to-end benchmark's numbers (bench/e2e.sh): one run's parse, the summary, the
table and the plot.

  e2e_report.py --parse CONFIG PROMPT RC STDOUT STDERR T_START   one JSON line for runs.jsonl
  e2e_report.py --summary META RUNS FIO...                       summary JSON on stdout
  e2e_report.py --table SUMMARY                                  the table (Markdown) and goals
  e2e_report.py --plot SUMMARY PNG                               tok/s per configuration and
                                                                 (a)'s decode step split

xpack-run's runs are read from its --json object (counters_prefill: the cache's counters when
prefill ended, so decode = counters - counters_prefill); llama.cpp's from the timings
llama_perf_context_print writes on stderr. Every number comes from random weights.
"""
import json
import re
import sys

NAMES = {
    "a": "(a) xpack-run, experts streamed from the pack",
    "n": "(n) (a0) without overlap (--no-overlap): the baseline",
    "a0": "(a0) (a) without the host-RAM tier (--host-cache-mib 0)",
    "ap": "(ap) (a) with the next-layer guess (--prefetch-next top-k)",
    "al": "(al) (a) with LRU instead of the adaptive policy (--cache-policy lru)",
    "a1": "(a1) (a) with a layer's experts read all at once (--read-splits 1 --queue-depth 64)",
    "ah": "(ah) (a) without the hash layers' prefetch (--no-hash-prefetch)",
    "av": "(av) (a) without the check of each expert read (--no-verify-experts)",
    "b": "(b) llama.cpp, experts on the CPU via mmap (--n-cpu-moe all)",
    "bp": "(b') llama.cpp, -ngl N whole layers on the GPU, rest via mmap",
    "c": "(c) llama.cpp, everything in VRAM",
    "d": "(d) xpack-run, every expert resident",
}
OURS = {"a", "a0", "a1", "ah", "al", "ap", "av", "d", "n"}
# The counters that only grow (the rest are sizes, medians and fractions).
CUMULATIVE = ("cache_hits", "cache_misses", "cache_evictions", "pack_reads", "pack_read_bytes", "h2d_bytes",
              "fallback_count", "io_errors", "acquires", "steps", "stall_ns", "stall_waits", "deferred_experts",
              "prefetch_issued", "prefetch_used", "prefetch_wasted", "host_hits", "host_demotions", "host_evictions",
              "d2h_bytes", "ssd_busy_ns")


def parse_run(cfg, prompt, rc, out_path, err_path, t_start):
    run = {"config": cfg, "prompt": int(prompt), "rc": int(rc)}
    if cfg in OURS:
        try:
            lines = [l for l in open(out_path, errors="replace").read().splitlines() if l.startswith("{")]
            j = json.loads(lines[-1])
        except (OSError, IndexError, ValueError) as e:
            run["error"] = f"no JSON from xpack-run: {e}"
            run["stderr_tail"] = open(err_path, errors="replace").read()[-400:]
            return run
        run.update(n_prompt=len(j["prompt_ids"]), n_gen=len(j["gen_ids"]), load_s=j["load_s"],
                   prefill_s=j["prefill_s"], decode_s=j["decode_s"])
        # Decode steps (what decode_s times): xpack-run feeds every generated token back,
        # but one that ends the run (a stop string, EOS).
        run["n_decode"] = len(j["gen_ids"]) if j["finish_reason"] == "length" else max(len(j["gen_ids"]) - 1, 0)
        total, pre = j.get("counters", {}), j.get("counters_prefill", {})
        run["counters"] = total
        run["decode_counters"] = {k: total[k] - pre[k] for k in CUMULATIVE if k in total and k in pre}
        # On CUDA: how long the host waited for the GPU during the decode (the rest is the host's own).
        if "cuda_host_wait" in j:
            run["decode_host_wait_s"] = j["cuda_host_wait"]["decode_s"]
        return run
    err = open(err_path, errors="replace").read()
    def grab(pattern):
        m = re.search(pattern, err)
        return m.groups() if m else None
    load = grab(r"load time =\s*([\d.]+) ms")
    pe = grab(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
    ev = grab(r"\s eval time =\s*([\d.]+) ms /\s*(\d+) runs")
    if not (pe and ev):
        run["error"] = "no llama_perf timings on stderr"
        run["stderr_tail"] = err[-400:]
        return run
    run.update(n_prompt=int(pe[1]), prefill_s=float(pe[0]) / 1e3, n_decode=int(ev[1]), n_gen=int(ev[1]) + 1,
               decode_s=float(ev[0]) / 1e3, load_s=float(load[0]) / 1e3 if load else None)
    return run


def summarize(meta_path, runs_path, *fio_paths):
    meta = json.load(open(meta_path))
    fio = {}
    for p in fio_paths:
        try:
            j = json.load(open(p))
            o = j["global options"] if "global options" in j else {}
            job = j["jobs"][0]
            fio[p.rsplit("/", 1)[-1]] = {"bs": job["job options"].get("bs", o.get("bs")),
                                         "iodepth": job["job options"].get("iodepth", o.get("iodepth")),
                                         "read_bytes_per_s": job["read"]["bw_bytes"]}
        except (OSError, ValueError, KeyError, IndexError):
            pass
    fio_bw = max((f["read_bytes_per_s"] for f in fio.values()), default=None)
    runs = [json.loads(l) for l in open(runs_path) if l.strip()]
    configs = {}
    for cfg in [c for c in meta["configs"].split(",") if c]:
        rs = [r for r in runs if r["config"] == cfg]
        ok = [r for r in rs if r["rc"] == 0 and "error" not in r]
        s = {"name": NAMES.get(cfg, cfg), "runs": len(rs), "ok": len(ok),
             "failures": [{"prompt": r["prompt"], "rc": r["rc"], "error": r.get("error"), "tail": r.get("stderr_tail")}
                          for r in rs if r not in ok]}
        if ok:
            n_prompt = sum(r["n_prompt"] for r in ok)
            n_decode = sum(r["n_decode"] for r in ok)
            prefill_s = sum(r["prefill_s"] for r in ok)
            decode_s = sum(r["decode_s"] for r in ok)
            s.update(prompt_tokens=n_prompt, decode_steps=n_decode, prefill_tok_s=n_prompt / prefill_s if prefill_s else None,
                     decode_tok_s=n_decode / decode_s if decode_s else None,
                     step_ms=1e3 * decode_s / n_decode if n_decode else None,
                     load_s_mean=sum(r["load_s"] or 0 for r in ok) / len(ok))
            if cfg in OURS and ok[0].get("decode_counters"):
                dc = {}
                for r in ok:
                    for k, v in r["decode_counters"].items():
                        dc[k] = dc.get(k, 0) + v
                hits, misses = dc.get("cache_hits", 0), dc.get("cache_misses", 0)
                s["decode_hit_rate"] = hits / (hits + misses) if hits + misses else None
                # Lookups that needed no read: device hits and host-tier hits.
                s["decode_hit_rate_with_host"] = (hits + dc.get("host_hits", 0)) / (hits + misses) if hits + misses else None
                s["host_frames"] = ok[0]["counters"].get("host_frames")
                s["ssd_bytes_per_token"] = dc.get("pack_read_bytes", 0) / n_decode if n_decode else None
                s["stall_fraction"] = dc.get("stall_ns", 0) / 1e9 / decode_s if decode_s else None
                # Measured by the cache (time with a read in flight); before it had
                # that counter, estimated as bytes over fio's bandwidth (which can pass 100 %).
                if "ssd_busy_ns" in dc:
                    s["ssd_busy_fraction"] = dc["ssd_busy_ns"] / 1e9 / decode_s if decode_s else None
                elif fio_bw:
                    s["ssd_busy_fraction"] = dc.get("pack_read_bytes", 0) / fio_bw / decode_s if decode_s else None
                s["decode_counters"] = dc
        configs[cfg] = s
    summary = {"meta": meta, "fio_read_bytes_per_s": fio_bw, "fio": fio, "configs": configs,
               "note": "random weights (xpack-synth): routing is not a trained model's; see doc/benchmarks.md"}
    a, d = configs.get("a", {}), configs.get("d", {})
    if a.get("step_ms") and fio_bw and a.get("ssd_bytes_per_token") is not None:
        disk_ms = 1e3 * a["ssd_bytes_per_token"] / fio_bw
        compute_ms = d.get("step_ms")
        bound = max(disk_ms, compute_ms or 0)
        summary["step_model"] = {"step_ms": a["step_ms"], "miss_bytes_over_disk_ms": disk_ms, "compute_ms_from_d": compute_ms,
                                 "bound_ms": bound, "step_over_bound": a["step_ms"] / bound if bound else None,
                                 "goal": "<= 1.15"}
        # The wait on misses (stall_ns) holds the read and its H2D copy; split it by their
        # median times per object (an estimate: the cache times each read and copy).
        stall_ms = a["stall_fraction"] * a["step_ms"] if a.get("stall_fraction") is not None else None
        tot = ok_runs_counter(runs, "a")
        if stall_ms is not None and tot:
            rp, hp = tot.get("read_p50_ns", 0), tot.get("h2d_p50_ns", 0)
            h2d_share = hp / (rp + hp) if rp + hp else 0
            summary["step_split_ms"] = {"compute": a["step_ms"] - stall_ms, "wait_ssd": stall_ms * (1 - h2d_share),
                                        "wait_h2d": stall_ms * h2d_share,
                                        "method": "wait = the cache's stall_ns in decode; split by median read vs H2D time per object"}
    best_llama = max([configs[c]["decode_tok_s"] for c in ("b", "bp") if configs.get(c, {}).get("decode_tok_s")] or [0])
    if a.get("decode_tok_s") and best_llama:
        summary["decode_speedup_vs_best_of_b_bp"] = {"value": a["decode_tok_s"] / best_llama, "goal": ">= 7"}
    return summary


def ok_runs_counter(runs, cfg):
    """The last good run's whole-run counters (for the per-object medians)."""
    for r in reversed(runs):
        if r["config"] == cfg and r["rc"] == 0 and "counters" in r:
            return r["counters"]
    return None


def fmt(v, spec="%.2f"):
    return "-" if v is None else spec % v


def table(summary):
    m = summary["meta"]
    print(f"e2e: {m['arch']} ({m['preset']} preset, {m['layers']} layers, random weights), model "
          f"{m['model_bytes'] / 1e9:.2f} GB, pack {m['pack_bytes'] / 1e9:.2f} GB, RAM cap "
          f"{m['ram_cap_bytes'] / 2**30:.2f} GiB ({'applied' if m['ram_capped'] else 'NOT applied'}), cache "
          f"{m['cache_mib']:.0f} MiB{' (raised to top-k objects)' if m.get('cache_at_top_k_floor') else ''}, (b') -ngl {m['ngl_bp']}, {m['prompts']} prompts x {m['tokens']} tokens, "
          f"{m['gpu']}, git {m['git']}")
    bw = summary.get("fio_read_bytes_per_s")
    shapes = ", ".join(f"{f['bs']} x {f['iodepth']}: {f['read_bytes_per_s'] / 1e9:.2f}" for f in summary.get("fio", {}).values())
    print(f"disk (fio randread on the pack, O_DIRECT, GB/s): {shapes}; used: {fmt(bw and bw / 1e9)} GB/s")
    print()
    print("| configuration | prompts ok | prefill tok/s | decode tok/s | step ms | decode hit rate (with host tier) | SSD MB/token | SSD busy | stalled |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cfg, s in summary["configs"].items():
        print(f"| {s['name']} | {s['ok']}/{s['runs']} | {fmt(s.get('prefill_tok_s'))} | {fmt(s.get('decode_tok_s'))} | "
              f"{fmt(s.get('step_ms'))} | {fmt(s.get('decode_hit_rate') and 100 * s['decode_hit_rate'], '%.1f %%')}"
              f"{' (' + fmt(100 * s['decode_hit_rate_with_host'], '%.1f %%') + ')' if s.get('host_frames') else ''} | "
              f"{fmt(s.get('ssd_bytes_per_token') and s['ssd_bytes_per_token'] / 1e6, '%.1f')} | "
              f"{fmt(s.get('ssd_busy_fraction') and 100 * s['ssd_busy_fraction'], '%.0f %%')} | "
              f"{fmt(s.get('stall_fraction') and 100 * s['stall_fraction'], '%.0f %%')} |")
    print()
    for cfg, s in summary["configs"].items():
        for f in s["failures"][:2]:
            print(f"FAILED {cfg} prompt {f['prompt']} rc {f['rc']}: {f['error'] or ''} {(f['tail'] or '').strip()[-300:]}")
    if "decode_speedup_vs_best_of_b_bp" in summary:
        print(f"goal (a) decode >= 7x the better of (b), (b'): {summary['decode_speedup_vs_best_of_b_bp']['value']:.2f}x")
    if "step_model" in summary:
        sm = summary["step_model"]
        print(f"goal (a) step <= 1.15 x max(miss bytes / disk, compute (d)): step {sm['step_ms']:.1f} ms, disk "
              f"{sm['miss_bytes_over_disk_ms']:.1f} ms, compute {fmt(sm['compute_ms_from_d'], '%.1f')} ms: "
              f"{fmt(sm['step_over_bound'])}x")
    if "step_split_ms" in summary:
        sp = summary["step_split_ms"]
        print(f"(a) decode step: compute {sp['compute']:.1f} ms, waiting on SSD {sp['wait_ssd']:.1f} ms, "
              f"waiting on H2D {sp['wait_h2d']:.1f} ms (estimate: {sp['method']})")


def plot(summary, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cfgs = [c for c, s in summary["configs"].items() if s.get("decode_tok_s")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 1.3]})
    x = range(len(cfgs))
    ax1.bar([i - 0.2 for i in x], [summary["configs"][c]["decode_tok_s"] for c in cfgs], 0.4, label="decode")
    ax1.bar([i + 0.2 for i in x], [summary["configs"][c].get("prefill_tok_s") or 0 for c in cfgs], 0.4, label="prefill")
    ax1.set_yscale("log")
    ax1.set_xticks(list(x), [NAMES[c].split(")")[0] + ")" for c in cfgs])
    ax1.set_ylabel("tokens/s (log)")
    ax1.legend()
    m = summary["meta"]
    ax1.set_title(f"{m['arch']} synthetic ({m['layers']} layers, random weights), {m['gpu']}", fontsize=9)
    sp = summary.get("step_split_ms")
    if sp:
        parts = [("compute", sp["compute"]), ("waiting on SSD", sp["wait_ssd"]), ("waiting on H2D", sp["wait_h2d"])]
        bottom = 0
        for name, v in parts:
            ax2.bar([0], [v], 0.5, bottom=bottom, label=name)
            bottom += v
        d = summary["configs"].get("d", {}).get("step_ms")
        if d:
            ax2.bar([1], [d], 0.5, label="(d) step (all resident)")
        ax2.set_xticks([0, 1], ["(a)", "(d)"])
        ax2.set_ylabel("decode step, ms")
        ax2.legend(fontsize=7)
    notes = [s["name"] for s in summary["configs"].values() if "[" in s["name"]]
    if notes:
        fig.text(0.01, 0.01, "; ".join(notes), fontsize=7)
    fig.tight_layout(rect=(0, 0.04 if notes else 0, 1, 1))
    fig.savefig(png, dpi=110)


def main(argv):
    if len(argv) >= 7 and argv[0] == "--parse":
        print(json.dumps(parse_run(*argv[1:7])))
    elif len(argv) >= 3 and argv[0] == "--summary":
        print(json.dumps(summarize(*argv[1:]), indent=1))
    elif len(argv) == 2 and argv[0] == "--table":
        table(json.load(open(argv[1])))
    elif len(argv) == 3 and argv[0] == "--plot":
        plot(json.load(open(argv[1])), argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
