#!/usr/bin/env python3
"""The compute-ceiling benchmark's numbers (bench/ceiling.sh).

  ceiling_report.py --vocab GGUF                        the model's vocabulary size
  ceiling_report.py --prompt-ids N VOCAB                N comma-separated token ids, the first
                                                        N of one fixed pseudo-random sequence
                                                        in [3, VOCAB)
  ceiling_report.py --parse-ours D RC STDOUT STDERR T_START VRAM [REP [WHO]]
                                                        one JSON line for runs.jsonl: an
                                                        xpack-run --json run at context D
                                                        (VRAM: nvidia-smi samples, may be absent;
                                                        REP: which of the context's runs;
                                                        WHO: ours (default) or against, the
                                                        --against build's run)
  ceiling_report.py --brief RUNS                        runs.jsonl's last run, one line
  ceiling_report.py --summary META RUNS OUTDIR          ceiling.json on stdout (OUTDIR holds
                                                        llama-{pp,tg}.json, .rc, logs/ and
                                                        llama-skipped.txt: why it did not run)
  ceiling_report.py --table CEILING_JSON                the table (Markdown); exit status 1
                                                        when a run failed

Ours: prefill tok/s = D / prefill_s, decode = the --tokens fed-back steps at positions
D..D+N-1 over decode_s (xpack-run's --json), the median of the context's runs (one process
each, as many as llama-bench's repetitions). llama.cpp: llama-bench -o json, pp D (-p D -n 0)
and tg N at depth D (-p 0 -n N -d D), avg_ts over its repetitions. Random weights
(xpack-synth): speeds only, no quality.
"""
import json
import os
import random
import re
import signal
import statistics
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_report import fmt, parse_run  # noqa: E402  (xpack-run's --json, read as e2e.sh reads it)

PROMPT_SEED = 20261201  # one fixed sequence: every run's prompt is a prefix of it


def gguf_vocab(path):
    """{arch}.vocab_size, else the length of tokenizer.ggml.tokens (GGUF v2/v3 header)."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version, _, n_kv = struct.unpack("<IQQ", f.read(20))
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not read here")

        def string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", "replace")

        def skip(t):
            if t in sizes:
                f.seek(sizes[t], 1)
            elif t == 8:
                string()
            elif t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                if et in sizes:
                    f.seek(sizes[et] * n, 1)
                else:
                    for _ in range(n):
                        skip(et)
            else:
                raise ValueError(f"{path}: unknown GGUF value type {t}")

        tokens = None
        for _ in range(n_kv):
            key = string()
            (t,) = struct.unpack("<I", f.read(4))
            if key.endswith(".vocab_size") and t in (4, 5):
                return struct.unpack("<I" if t == 4 else "<i", f.read(4))[0]
            if key == "tokenizer.ggml.tokens" and t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                tokens = n
                for _ in range(n):
                    skip(et)
                continue
            skip(t)
        if tokens is None:
            raise ValueError(f"{path}: neither *.vocab_size nor tokenizer.ggml.tokens")
        return tokens


def prompt_ids(n, vocab):
    if vocab <= 3 or n < 1:
        raise ValueError(f"need a vocabulary above 3 and at least one id (got {vocab}, {n})")
    r = random.Random(PROMPT_SEED)
    # Ids 0-2 are the control tokens xpack-synth writes (<unk>, <s>, </s>).
    return [r.randrange(3, vocab) for _ in range(n)]


def read_text(path):
    try:
        return open(path, errors="replace").read()
    except OSError:
        return ""


def vram_plan(err):
    """xpack-run's 'VRAM plan (...)' line at load, and its MiB figures."""
    m = re.search(r"VRAM plan \([^)]*\): (.*)", err)
    if not m:
        return None
    line = m.group(1).strip()
    plan = {"line": line}
    for key, pattern in (("trunk_mib", r"trunk ([\d.]+) MiB"), ("state_mib", r"KV/state and norms ([\d.]+) MiB"),
                         ("workspace_mib", r"workspace ([\d.]+) MiB"), ("expert_cache_mib", r"expert cache ([\d.]+) MiB"),
                         ("free_mib", r"free ([\d.]+) MiB"), ("total_mib", r"of ([\d.]+) MiB")):
        v = re.search(pattern, line)
        if v:
            plan[key] = float(v.group(1))
    return plan


def vram_samples(path):
    """nvidia-smi's 'used, total' MiB lines: (peak used, total) or (None, None)."""
    used, total = [], None
    for line in read_text(path).splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            used.append(int(parts[0]))
            total = int(parts[1])
    return (max(used) if used else None), total


def parse_ours(d, rc, out_path, err_path, t_start, vram_path):
    run = parse_run("d", d, rc, out_path, err_path, t_start)
    run["context"] = int(d)
    del run["prompt"], run["config"]
    err = read_text(err_path)
    run.pop("counters", None)
    dc = run.pop("decode_counters", {}) or {}
    # Every expert resident: a decode step that misses or reads would not be the ceiling.
    run["decode_cache_misses"] = dc.get("cache_misses")
    run["decode_pack_reads"] = dc.get("pack_reads")
    m = re.search(r"(\d+) experts preloaded", err)
    run["experts_preloaded"] = int(m.group(1)) if m else None
    run["vram_plan"] = vram_plan(err)
    run["vram_peak_mib"], run["vram_total_mib"] = vram_samples(vram_path)
    cut = re.search(r"generating (\d+) tokens, not (\d+): the context holds (\d+)", err)
    if "error" not in run and int(rc) != 0:
        run["error"] = f"xpack-run exited with {exit_text(int(rc))}"
        run["stderr_tail"] = err[-400:]
    if "error" not in run and run["n_prompt"] != int(d):
        run["error"] = f"the prompt had {run['n_prompt']} tokens, not {d}"
    if "error" not in run and cut:
        run["error"] = f"the context was cut: {cut.group(0)}"
    on_gpu = run["vram_plan"] is not None
    run["fitted"] = "error" not in run and (not on_gpu or run["vram_peak_mib"] is None or
                                            run["vram_peak_mib"] < run["vram_total_mib"])
    return run


def brief(runs_path):
    lines = [l for l in open(runs_path) if l.strip()]
    if not lines:
        return "no run"
    r = json.loads(lines[-1])
    if "error" in r:
        return f"FAILED (rc {r['rc']}): {r['error']}"
    s = (f"prefill {r['n_prompt'] / r['prefill_s']:.1f} tok/s, decode {1e3 * r['decode_s'] / r['n_decode']:.2f} ms/token"
         if r["prefill_s"] and r["decode_s"] and r["n_decode"] else "no timings")
    if r.get("vram_peak_mib") is not None:
        s += f", VRAM peak {r['vram_peak_mib']} of {r['vram_total_mib']} MiB"
    if r.get("decode_host_wait_s") is not None and r["decode_s"]:
        s += f", host waiting for the GPU {100 * r['decode_host_wait_s'] / r['decode_s']:.0f} % of decode"
    return s


def llama_tests(json_path):
    """llama-bench -o json's tests; a run cut short leaves an unclosed array, whose
    finished tests are kept."""
    text = read_text(json_path).strip()
    if not text:
        return []
    for candidate in (text, text.rstrip(",") + "\n]"):
        try:
            tests = json.loads(candidate)
            return tests if isinstance(tests, list) else []
        except ValueError:
            pass
    return []


def llama_side(outdir, kind):
    rc_text = read_text(os.path.join(outdir, f"llama-{kind}.rc")).strip()
    if not rc_text:
        return {"ran": False, "tests": []}
    rc = int(rc_text)
    tests = llama_tests(os.path.join(outdir, f"llama-{kind}.json"))
    side = {"ran": True, "rc": rc, "tests": [{k: t.get(k) for k in ("n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts",
                                                                    "n_threads", "flash_attn", "backends", "gpu_info")}
                                           for t in tests]}
    if rc != 0 or not tests:
        side["error"] = f"llama-bench {kind} exited with {exit_text(rc)}" + ("" if tests else ", no test in its JSON")
        side["tail"] = read_text(os.path.join(outdir, "logs", f"llama-{kind}.log"))[-400:]
    return side


def exit_text(rc):
    """An exit status in words: 124/137 are timeout's, above 128 a signal (SIGFPE: 136)."""
    if rc in (124, 137):
        return f"{rc} (timed out: the --deadline or 600 s)"
    if rc > 128:
        try:
            return f"{rc} (killed by {signal.Signals(rc - 128).name})"
        except ValueError:
            pass
    return str(rc)


def ratio(a, b):
    return a / b if a and b else None


def speeds(good, who, row):
    """Into row: WHO's prefill tok/s and decode ms/token of each run that ended well, and their medians."""
    prefill = [x["n_prompt"] / x["prefill_s"] for x in good if x["prefill_s"]]
    decode_ms = [1e3 * x["decode_s"] / x["n_decode"] for x in good if x["n_decode"]]
    row[f"{who}_prefill_tok_s_runs"] = prefill
    row[f"{who}_decode_ms_runs"] = decode_ms
    row[f"{who}_prefill_tok_s"] = statistics.median(prefill) if prefill else None
    row[f"{who}_decode_ms"] = statistics.median(decode_ms) if decode_ms else None


def summarize(meta_path, runs_path, outdir):
    meta = json.load(open(meta_path))
    runs = [json.loads(l) for l in open(runs_path) if l.strip()]
    pp, tg = llama_side(outdir, "pp"), llama_side(outdir, "tg")
    rows = []
    for d in meta["contexts"]:
        # Each context ran --reps times (a process each), as llama-bench's tests do: the
        # row holds the median of the runs that ended well, and every run's value.
        mine = [x for x in runs if x["context"] == d and x.get("who", "ours") == "ours"]
        good = [x for x in mine if "error" not in x]
        row = {"context": d, "ours_ran": bool(mine), "ours_runs": len(good)}
        # The --against build's runs, each right before one of ours: its medians and
        # ours' speed-up over it (> 1: ours is faster).
        theirs = [x for x in runs if x["context"] == d and x.get("who") == "against" and "error" not in x]
        if theirs:
            speeds(theirs, "against", row)
        if good:
            speeds(good, "ours", row)
            row["ours_decode_tok_s"] = 1e3 / row["ours_decode_ms"] if row["ours_decode_ms"] else None
            row["ours_decode_steps"] = good[0]["n_decode"]
            # The share of decode the host spent waiting for the GPU: near 1 the GPU sets
            # the step time; near 0 the host does (building and enqueueing the steps).
            waits = [x["decode_host_wait_s"] / x["decode_s"] for x in good
                     if x.get("decode_host_wait_s") is not None and x["decode_s"]]
            if waits:
                row["ours_decode_host_wait_share"] = statistics.median(waits)
            row["ours_load_s"] = statistics.median(x["load_s"] for x in good)
        if mine:
            first = mine[0]
            for k in ("vram_total_mib", "vram_plan", "experts_preloaded"):
                row["ours_" + k] = first.get(k)
            # The worst run speaks for the context: a peak, a miss or a read in any of them.
            row["ours_fitted"] = all(x.get("fitted") for x in mine)
            for k in ("vram_peak_mib", "decode_cache_misses", "decode_pack_reads"):
                vals = [x.get(k) for x in mine if x.get(k) is not None]
                row["ours_" + k] = max(vals) if vals else None
        # A context llama-bench ran twice keeps its last test: ceiling.sh runs the first
        # context twice because a process's first test comes out slow.
        p = next((t for t in reversed(pp["tests"]) if t["n_prompt"] == d and not t["n_gen"]), None)
        g = next((t for t in reversed(tg["tests"]) if t["n_depth"] == d and t["n_gen"] and not t["n_prompt"]), None)
        row["llama_pp_tok_s"] = p["avg_ts"] if p else None
        row["llama_pp_stddev"] = p["stddev_ts"] if p else None
        row["llama_tg_tok_s"] = g["avg_ts"] if g else None
        row["llama_tg_stddev"] = g["stddev_ts"] if g else None
        row["llama_tg_ms"] = 1e3 / g["avg_ts"] if g and g["avg_ts"] else None
        row["prefill_ratio"] = ratio(row.get("ours_prefill_tok_s"), row["llama_pp_tok_s"])
        row["decode_ratio"] = ratio(row.get("ours_decode_tok_s"), row["llama_tg_tok_s"])
        if theirs:
            row["against_prefill_speedup"] = ratio(row.get("ours_prefill_tok_s"), row["against_prefill_tok_s"])
            row["against_decode_speedup"] = ratio(row["against_decode_ms"], row.get("ours_decode_ms"))
            # The other side against llama.cpp too (--against-args: ours with other flags).
            row["against_prefill_ratio"] = ratio(row["against_prefill_tok_s"], row["llama_pp_tok_s"])
            row["against_decode_ratio"] = ratio(1e3 / row["against_decode_ms"] if row["against_decode_ms"] else None,
                                                row["llama_tg_tok_s"])
        rows.append(row)
    # What a longer context costs a decode step: the architecture's part of the step
    # (attention over the window and the compressed branches, or KDA's fixed state).
    base = rows[0] if rows else {}
    for row in rows:
        for who in ("ours", "llama"):
            a, b = row.get(f"{who}_decode_ms" if who == "ours" else "llama_tg_ms"), \
                base.get(f"{who}_decode_ms" if who == "ours" else "llama_tg_ms")
            row[f"{who}_decode_ms_over_first"] = a - b if a is not None and b is not None else None
    failures = [{"what": f"{r.get('who', 'ours')} D={r['context']}" + (f" run {r['rep']}" if r.get("rep") else ""),
                 "rc": r["rc"],
                 "error": r["error"], "tail": r.get("stderr_tail", "")}
                for r in runs if "error" in r]
    failures += [{"what": f"ours D={row['context']}", "rc": None, "error": "not run (the --deadline)", "tail": ""}
                 for row in rows if not row["ours_ran"]]
    for kind, side in (("pp", pp), ("tg", tg)):
        if side.get("error"):
            failures.append({"what": f"llama-bench {kind}", "rc": side["rc"], "error": side["error"], "tail": side["tail"]})
        elif meta.get("llama") and not side["ran"]:
            failures.append({"what": f"llama-bench {kind}", "rc": None, "error": "not run (the --deadline)", "tail": ""})
    skipped = read_text(os.path.join(outdir, "llama-skipped.txt")).strip()
    if skipped:
        failures.append({"what": "llama.cpp", "rc": None, "error": "not run: " + skipped, "tail": ""})
    return {"meta": meta, "rows": rows, "llama_pp": pp, "llama_tg": tg, "failures": failures,
            "goal": "ours >= llama.cpp (ratio >= 1) for prefill and decode",
            "note": "random weights (xpack-synth): speeds only; see doc/benchmarks.md"}


def table(summary):
    m = summary["meta"]
    print(f"ceiling: {m['arch']} ({m['preset']} preset, {m['layers']} layers, random weights), model "
          f"{m['model_bytes'] / 1e9:.2f} GB, pack {m['pack_bytes'] / 1e9:.2f} GB all resident (cache {m['cache_mib']:.0f} MiB), "
          f"{m['tokens']} decoded tokens per context, llama-bench -r {m['reps']}, RAM cap "
          f"{m['ram_cap_bytes'] / 2**30:.2f} GiB ({'applied' if m['ram_capped'] else 'NOT applied'}), "
          f"{m['gpu'] or m['device']}, git {m['git']}")
    if not m.get("llama"):
        print("llama.cpp: not run (--no-llama, or it could not be built): ours only")
    print()
    print("| context D | ours prefill tok/s | llama pp D tok/s | ratio | ours decode ms/token | ours decode tok/s | "
          "llama tg @ d D tok/s | ratio | ours VRAM peak / total MiB | fitted |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in summary["rows"]:
        vram = (f"{r['ours_vram_peak_mib']} / {r['ours_vram_total_mib']}" if r.get("ours_vram_peak_mib") is not None else "-")
        fitted = {True: "yes", False: "NO", None: "-"}[r.get("ours_fitted")]
        print(f"| {r['context']} | {fmt(r.get('ours_prefill_tok_s'), '%.1f')} | {fmt(r['llama_pp_tok_s'], '%.1f')} | "
              f"{fmt(r['prefill_ratio'])} | {fmt(r.get('ours_decode_ms'))} | {fmt(r.get('ours_decode_tok_s'), '%.1f')} | "
              f"{fmt(r['llama_tg_tok_s'], '%.1f')} | {fmt(r['decode_ratio'])} | {vram} | {fitted} |")
    rows = summary["rows"]
    if len(rows) > 1:
        print()
        print("decode ms/token more than at D=%d: " % rows[0]["context"] + ", ".join(
            f"D={r['context']}: ours {fmt(r['ours_decode_ms_over_first'])}, llama.cpp {fmt(r['llama_decode_ms_over_first'])}"
            for r in rows[1:]))
    spread = [r for r in rows if len(r.get("ours_decode_ms_runs") or []) > 1]
    if spread:
        print("ours, the median of each context's runs; decode ms/token of each run: " + ", ".join(
            f"D={r['context']}: " + " / ".join(fmt(v) for v in r["ours_decode_ms_runs"]) for r in spread))
    against = [r for r in rows if r.get("against_decode_ms_runs") or r.get("against_prefill_tok_s_runs")]
    if against:
        print(f"against {m.get('against')} (run right before each of ours): " + ", ".join(
            f"D={r['context']}: decode {' / '.join(fmt(v) for v in r['against_decode_ms_runs'])} ms "
            f"(ours {' / '.join(fmt(v) for v in r.get('ours_decode_ms_runs') or [])}; speed-up "
            f"{fmt(r['against_decode_speedup'])}), prefill {fmt(r['against_prefill_tok_s'], '%.1f')} tok/s "
            f"(speed-up {fmt(r['against_prefill_speedup'])})" for r in against))
        if any(r.get("against_prefill_ratio") or r.get("against_decode_ratio") for r in against):
            print("against, next to llama.cpp: " + ", ".join(
                f"D={r['context']}: prefill {fmt(r.get('against_prefill_ratio'))}x, decode {fmt(r.get('against_decode_ratio'))}x"
                for r in against))
    waits = [r for r in rows if r.get("ours_decode_host_wait_share") is not None]
    if waits:
        print("ours, the host waiting for the GPU (share of decode; near 0: the host sets the step time): " +
              ", ".join(f"D={r['context']}: {100 * r['ours_decode_host_wait_share']:.0f} %" for r in waits))
    plans = [r.get("ours_vram_plan") for r in rows if r.get("ours_vram_plan")]
    if plans:
        print(f"VRAM plan at load (D={rows[0]['context']}): {plans[0]['line']}")
    for r in rows:
        if r.get("ours_decode_cache_misses") or r.get("ours_decode_pack_reads"):
            print(f"WARNING ours D={r['context']}: {r['ours_decode_cache_misses']} cache misses, "
                  f"{r['ours_decode_pack_reads']} pack reads in decode: not every expert was resident")
    for f in summary["failures"]:
        print(f"FAILED {f['what']} (rc {fmt(f['rc'], '%d')}): {f['error']}"
              + (f"\n  last lines: {f['tail'].strip()[-300:]}" if f["tail"].strip() else ""))
    return 1 if summary["failures"] else 0


def main(argv):
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    try:
        if len(argv) == 2 and argv[0] == "--vocab":
            print(gguf_vocab(argv[1]))
        elif len(argv) == 3 and argv[0] == "--prompt-ids":
            print(",".join(map(str, prompt_ids(int(argv[1]), int(argv[2])))))
        elif len(argv) in (7, 8, 9) and argv[0] == "--parse-ours":
            run = parse_ours(*argv[1:7])
            if len(argv) >= 8:
                run["rep"] = int(argv[7])
            if len(argv) == 9:
                if argv[8] not in ("ours", "against"):
                    raise ValueError(f"WHO is ours or against, not {argv[8]!r}")
                run["who"] = argv[8]
            print(json.dumps(run))
        elif len(argv) == 2 and argv[0] == "--brief":
            print(brief(argv[1]))
        elif len(argv) == 4 and argv[0] == "--summary":
            print(json.dumps(summarize(*argv[1:4]), indent=1))
        elif len(argv) == 2 and argv[0] == "--table":
            return table(json.load(open(argv[1])))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (OSError, ValueError, struct.error) as e:
        print(f"ceiling_report.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
