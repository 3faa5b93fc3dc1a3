#!/usr/bin/env python3
"""bench/ceiling_report.py on made-up runs (meson test bench_ceiling_report): xpack-run's
--json and stderr, llama-bench's JSON (one whole, one cut short), a failed run, the GGUF
vocabulary reader and the prompt ids. Nothing here needs a GPU or a model."""
import json
import os
import struct
import subprocess
import sys
import tempfile

from checks import check, finish

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(HERE, "ceiling_report.py")


def report(*args):
    return subprocess.run([sys.executable, REPORT, *args], capture_output=True, text=True)


def gguf(path, kvs):
    """A GGUF header with the given (key, type, packed value) triples and no tensor."""
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)))
        for key, t, payload in kvs:
            k = key.encode()
            f.write(struct.pack("<Q", len(k)) + k + struct.pack("<I", t) + payload)


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def ours_json(d, tokens, prefill_s, decode_s, misses=0, host_wait_s=None):
    counters = {"cache_hits": 100, "cache_misses": 5 + misses, "pack_reads": 7 + misses}
    prefill = {"cache_hits": 40, "cache_misses": 5, "pack_reads": 7}
    j = {"prompt_ids": list(range(3, 3 + d)), "gen_ids": [5] * tokens, "finish_reason": "length",
         "n_ctx": 1048576, "load_s": 2.0, "prefill_s": prefill_s, "decode_s": decode_s,
         "counters": counters, "counters_prefill": prefill}
    if host_wait_s is not None:  # a CUDA run's
        j["cuda_host_wait"] = {"prefill_s": 0.4, "decode_s": host_wait_s}
    return json.dumps(j)


PLAN = ("xpack-run: 1536 experts preloaded\nxpack-run: VRAM plan (cuda:0): trunk 1900.50 MiB, KV/state and norms "
        "12.25 MiB at load (KV caches grow with the sequence), workspace 64.00 MiB, expert cache 19600.00 MiB; "
        "free 120000.00 MiB of 143771.00 MiB\n")


def llama_test(n_prompt, n_gen, n_depth, ts):
    return {"n_prompt": n_prompt, "n_gen": n_gen, "n_depth": n_depth, "avg_ts": ts, "stddev_ts": 1.0,
            "n_threads": 16, "backends": "CUDA", "samples_ts": [ts]}


with tempfile.TemporaryDirectory() as tmp:
    j = lambda *p: os.path.join(tmp, *p)  # noqa: E731
    os.makedirs(j("logs"))
    # --- the vocabulary: the arch key, else the token list; not a GGUF refused
    gguf(j("a.gguf"), [("general.architecture", 8, gstr("deepseek4")), ("deepseek4.vocab_size", 4, struct.pack("<I", 129280))])
    toks = struct.pack("<IQ", 8, 5) + b"".join(gstr(f"t{i}") for i in range(5))
    gguf(j("b.gguf"), [("general.name", 8, gstr("x")), ("tokenizer.ggml.tokens", 9, toks),
                       ("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 5) + b"\0" * 20)])
    gguf(j("c.gguf"), [("general.name", 8, gstr("x"))])
    check(report("--vocab", j("a.gguf")).stdout.strip() == "129280", "vocab from deepseek4.vocab_size")
    check(report("--vocab", j("b.gguf")).stdout.strip() == "5", "vocab from tokenizer.ggml.tokens")
    r = report("--vocab", j("c.gguf"))
    check(r.returncode == 1 and "neither" in r.stderr, "a GGUF without a vocabulary refused: " + r.stderr)
    open(j("junk"), "w").write("not a model")
    r = report("--vocab", j("junk"))
    check(r.returncode == 1 and "not a GGUF" in r.stderr, "not a GGUF refused: " + r.stderr)
    # --- prompt ids: in range, deterministic, each a prefix of the longer
    long_ids = report("--prompt-ids", "4096", "129280").stdout.strip().split(",")
    short_ids = report("--prompt-ids", "512", "129280").stdout.strip().split(",")
    check(len(long_ids) == 4096 and long_ids[:512] == short_ids, "prompt ids: 4096 of them, 512 a prefix")
    check(all(3 <= int(i) < 129280 for i in long_ids) and len(set(long_ids)) > 3000, "prompt ids in [3, vocab), varied")
    check(report("--prompt-ids", "8", "3").returncode == 1, "a vocabulary of 3 refused")
    check(report("--bogus").returncode == 2 and report("--help").returncode == 0, "usage errors exit 2, --help 0")

    # --- ours: 512 well (VRAM sampled), 2048 with decode misses, 4096 failed (no JSON)
    open(j("o512.out"), "w").write(ours_json(512, 8, 0.5, 0.08, host_wait_s=0.02) + "\n")
    open(j("o512.err"), "w").write(PLAN)
    open(j("o512.vram"), "w").write("1000, 143771\n30000, 143771\n25000, 143771\n")
    open(j("o2048.out"), "w").write(ours_json(2048, 8, 2.0, 0.1, misses=3) + "\n")
    open(j("o2048.err"), "w").write(PLAN)
    open(j("o4096.out"), "w").write("")
    open(j("o4096.err"), "w").write(PLAN + "xpack-run: CUDA error: out of memory (cudaMalloc)\n")
    lines = []
    for d in (512, 2048, 4096):
        r = report("--parse-ours", str(d), "0" if d < 4096 else "1", j(f"o{d}.out"), j(f"o{d}.err"), "0", j(f"o{d}.vram"))
        check(r.returncode == 0, f"--parse-ours {d}: {r.stderr}")
        lines.append(r.stdout)
    open(j("runs.jsonl"), "w").write("".join(lines))
    runs = [json.loads(l) for l in lines]
    check(runs[0]["fitted"] and runs[0]["vram_peak_mib"] == 30000 and runs[0]["vram_total_mib"] == 143771,
          "512 fitted, VRAM peak from the samples")
    check(runs[0]["vram_plan"]["trunk_mib"] == 1900.5 and runs[0]["vram_plan"]["free_mib"] == 120000.0 and
          runs[0]["experts_preloaded"] == 1536, "VRAM plan and preload count parsed")
    check(runs[1]["decode_cache_misses"] == 3 and runs[1]["decode_pack_reads"] == 3, "decode misses = total - prefill")
    check(runs[0]["decode_host_wait_s"] == 0.02 and "decode_host_wait_s" not in runs[1],
          "the host's wait for the GPU in decode, where the run reports one")
    check("error" in runs[2] and not runs[2]["fitted"] and "out of memory" in runs[2]["stderr_tail"], "4096 failed, its tail kept")
    one = report("--brief", j("runs.jsonl")).stdout
    check(one.startswith("FAILED (rc 1)"), "--brief says the last run failed: " + one)

    # --- llama-bench: pp whole; tg cut short after two tests, rc 1
    meta = {"arch": "deepseek4", "preset": "deepseek-v4-flash", "layers": 6, "model_bytes": 22.6e9, "pack_bytes": 20.5e9,
            "cache_mib": 19600, "ram_cap_bytes": 4.6e9, "ram_capped": True, "ram_ratio": 0.2, "contexts": [512, 2048, 4096],
            "tokens": 8, "reps": 3, "vocab": 129280, "device": "cuda", "synth_args": "", "gpu": "H200", "llama": True, "git": "x"}
    json.dump(meta, open(j("meta.json"), "w"))
    # ceiling.sh's pp: the first context twice, the first a slow warm-up the report must pass over
    json.dump([llama_test(512, 0, 0, 600.0), llama_test(512, 0, 0, 2000.0), llama_test(2048, 0, 0, 1800.0),
               llama_test(4096, 0, 0, 1500.0)],
              open(j("llama-pp.json"), "w"), indent=1)
    cut = json.dumps([llama_test(0, 8, 512, 30.0), llama_test(0, 8, 512, 100.0), llama_test(0, 8, 2048, 80.0)], indent=1)
    open(j("llama-tg.json"), "w").write(cut[: cut.rindex("]")].rstrip() + ",\n")
    open(j("llama-pp.rc"), "w").write("0\n")
    open(j("llama-tg.rc"), "w").write("136\n")
    open(j("logs", "llama-tg.log"), "w").write("main: error: failed to create context with model\n")
    r = report("--summary", j("meta.json"), j("runs.jsonl"), tmp)
    check(r.returncode == 0, "--summary: " + r.stderr)
    s = json.loads(r.stdout)
    row = {x["context"]: x for x in s["rows"]}
    check(abs(row[512]["ours_prefill_tok_s"] - 1024) < 1e-9 and abs(row[512]["prefill_ratio"] - 0.512) < 1e-9,
          "prefill 512 / 0.5 s against pp512's second test")
    check(abs(row[512]["ours_decode_ms"] - 10) < 1e-9 and abs(row[512]["decode_ratio"] - 1.0) < 1e-9,
          "decode 10 ms/token against tg at depth 512")
    check(abs(row[512]["ours_decode_host_wait_share"] - 0.25) < 1e-9 and "ours_decode_host_wait_share" not in row[2048],
          "host wait share 0.02 of 0.08 s at 512, none reported at 2048")
    check(abs(row[2048]["ours_decode_ms_over_first"] - 2.5) < 1e-9 and abs(row[2048]["llama_decode_ms_over_first"] - 2.5) < 1e-9,
          "the step's growth with the context, both sides")
    check(row[4096]["llama_tg_tok_s"] is None and row[4096]["llama_pp_tok_s"] == 1500.0 and
          row[4096].get("ours_prefill_tok_s") is None, "4096: only llama's pp")
    what = [f["what"] for f in s["failures"]]
    check(what == ["ours D=4096", "llama-bench tg"], f"failures named: {what}")
    json.dump(s, open(j("ceiling.json"), "w"))
    r = report("--table", j("ceiling.json"))
    check(r.returncode == 1, "--table exits 1 when a run failed")
    check("| 512 | 1024.0 | 2000.0 | 0.51 | 10.00 | 100.0 | 100.0 | 1.00 | 30000 / 143771 | yes |" in r.stdout,
          "the 512 row:\n" + r.stdout)
    check("FAILED ours D=4096 (rc 1)" in r.stdout and "out of memory" in r.stdout, "the failed run and its tail in the table")
    check("FAILED llama-bench tg (rc 136): llama-bench tg exited with 136 (killed by SIGFPE)" in r.stdout and
          "failed to create context" in r.stdout, "llama's failure, its signal and its tail")
    check("WARNING ours D=2048: 3 cache misses" in r.stdout, "decode misses flagged")
    check("the host waiting for the GPU (share of decode; near 0: the host sets the step time): D=512: 25 %" in r.stdout,
          "the host's wait share printed where reported")
    # A second run of each of 512 and 4096 (as --reps 2 makes them): 512's row is the median
    # of its two runs and lists both; 4096's second run ended well, its first is still a failure.
    open(j("o512b.out"), "w").write(ours_json(512, 8, 0.25, 0.12, host_wait_s=0.06) + "\n")
    open(j("o4096b.out"), "w").write(ours_json(4096, 8, 4.0, 0.16) + "\n")
    extra = [report("--parse-ours", "512", "0", j("o512b.out"), j("o512.err"), "0", j("o512.vram"), "2").stdout,
             report("--parse-ours", "4096", "0", j("o4096b.out"), j("o512.err"), "0", j("none"), "2").stdout]
    check(json.loads(extra[0]).get("rep") == 2, "--parse-ours records which run it was")
    open(j("runs2.jsonl"), "w").write("".join(lines + extra))
    s2 = json.loads(report("--summary", j("meta.json"), j("runs2.jsonl"), tmp).stdout)
    row2 = {x["context"]: x for x in s2["rows"]}
    check(row2[512]["ours_runs"] == 2 and row2[512]["ours_decode_ms_runs"] == [10.0, 15.0] and
          abs(row2[512]["ours_decode_ms"] - 12.5) < 1e-9 and abs(row2[512]["ours_prefill_tok_s"] - 1536) < 1e-9 and
          abs(row2[512]["ours_decode_tok_s"] - 80.0) < 1e-9, "512: the median of two runs, both listed")
    check(abs(row2[512]["ours_decode_host_wait_share"] - 0.375) < 1e-9, "the host's wait share: the median of 0.25 and 0.5")
    check(row2[4096]["ours_runs"] == 1 and abs(row2[4096]["ours_decode_ms"] - 20.0) < 1e-9 and
          not row2[4096]["ours_fitted"], "4096: the run that ended well gives the numbers, the failed one unfits the row")
    check([f["what"] for f in s2["failures"]] == ["ours D=4096", "llama-bench tg"], "a failed run still named")
    json.dump(s2, open(j("ceiling2.json"), "w"))
    t2 = report("--table", j("ceiling2.json")).stdout
    check("decode ms/token of each run: D=512: 10.00 / 15.00" in t2, "each run's decode printed:\n" + t2)
    # --against: another build's runs, each right before one of ours, kept out of ours'
    # medians; its own medians and ours' speed-up over it; its failure named as its own.
    open(j("a512.out"), "w").write(ours_json(512, 8, 1.0, 0.096) + "\n")
    theirs = [report("--parse-ours", "512", "0", j("a512.out"), j("o512.err"), "0", j("o512.vram"), "1", "against").stdout,
              report("--parse-ours", "512", "0", j("a512.out"), j("o512.err"), "0", j("o512.vram"), "2", "against").stdout,
              report("--parse-ours", "2048", "1", j("o4096.out"), j("o4096.err"), "0", j("none"), "1", "against").stdout]
    check(json.loads(theirs[0]).get("who") == "against", "--parse-ours records whose run it was")
    check(report("--parse-ours", "512", "0", j("a512.out"), j("o512.err"), "0", j("o512.vram"), "1", "mine").returncode == 1,
          "a WHO that is neither ours nor against refused")
    open(j("runs3.jsonl"), "w").write("".join(lines + extra + theirs))
    meta["against"] = "/root/old/build-gpu"
    json.dump(meta, open(j("meta3.json"), "w"))
    s3 = json.loads(report("--summary", j("meta3.json"), j("runs3.jsonl"), tmp).stdout)
    row3 = {x["context"]: x for x in s3["rows"]}
    check(row3[512]["ours_decode_ms_runs"] == [10.0, 15.0] and row3[512]["ours_runs"] == 2,
          "the --against runs stay out of ours")
    check(row3[512]["against_decode_ms_runs"] == [12.0, 12.0] and abs(row3[512]["against_prefill_tok_s"] - 512) < 1e-9 and
          abs(row3[512]["against_decode_speedup"] - 12.0 / 12.5) < 1e-9 and
          abs(row3[512]["against_prefill_speedup"] - 1536 / 512) < 1e-9, "512: the other build's medians, ours' speed-up")
    check(abs(row3[512]["against_prefill_ratio"] - 512 / row3[512]["llama_pp_tok_s"]) < 1e-9 and
          abs(row3[512]["against_decode_ratio"] - (1e3 / 12.0) / row3[512]["llama_tg_tok_s"]) < 1e-9,
          "512: the other side against llama.cpp too")
    check("against_decode_ms" not in row3[4096], "no --against run at 4096: no numbers")
    check([f["what"] for f in s3["failures"]] == ["ours D=4096", "against D=2048 run 1", "llama-bench tg"],
          f"the other build's failure named: {[f['what'] for f in s3['failures']]}")
    json.dump(s3, open(j("ceiling3.json"), "w"))
    t3 = report("--table", j("ceiling3.json")).stdout
    check("against /root/old/build-gpu (run right before each of ours): D=512: decode 12.00 / 12.00 ms "
          "(ours 10.00 / 15.00; speed-up 0.96), prefill 512.0 tok/s (speed-up 3.00)" in t3, "the --against line:\n" + t3)
    want = "against, next to llama.cpp: D=512: prefill %.2fx, decode %.2fx" % (
        512 / row3[512]["llama_pp_tok_s"], (1e3 / 12.0) / row3[512]["llama_tg_tok_s"])
    check(want in t3, f"the --against line next to llama.cpp ({want}):\n" + t3)
    check("against" not in report("--table", j("ceiling2.json")).stdout, "no --against line without its runs")
    # llama.cpp not built: a failure that says why.
    os.makedirs(j("nb", "logs"))
    meta["llama"] = False
    json.dump(meta, open(j("nb", "meta.json"), "w"))
    open(j("nb", "llama-skipped.txt"), "w").write("the build failed: tar: x.tar.gz: Cannot open\n")
    nb = json.loads(report("--summary", j("nb", "meta.json"), j("runs.jsonl"), j("nb")).stdout)
    check([f["what"] for f in nb["failures"]] == ["ours D=4096", "llama.cpp"] and "Cannot open" in nb["failures"][1]["error"]
          and nb["rows"][0]["llama_pp_tok_s"] is None, "a llama.cpp that was not built: named, none of its numbers")
    # All well: exit 0.
    s["failures"] = []
    json.dump(s, open(j("ok.json"), "w"))
    check(report("--table", j("ok.json")).returncode == 0, "--table exits 0 when every run ended well")

finish()
