#!/usr/bin/env python3
"""Checks xpack-run against llama.cpp's logits for one oracle model and prompt.

For MODEL (a file in ORACLE/models, e.g. deepseek4-f32.gguf or
kimi-k3-q2k-q3k-00001-of-00003.gguf) and PROMPT (short | long):

 1. converts MODEL with xpack-build into a temporary directory;
 2. runs xpack-run teacher-forced on prompt_ids + gen_ids (-n 0) through the pack
    with a small cache (--cache-mib 4, experts stream), with a cache of only
    top-k + 1 objects, with the direct reader instead of libxpack's cache, with a
    cache large enough to keep every expert resident, and from the plain GGUF;
 3. requires all these logits files to be bit-identical;
 4. compares every row with the reference: the model's .seq.f32, or for a
    quantized model the -deq logits (exact arithmetic on the quantized weights):
    max |diff| <= 1e-3 per row, except rows at and after the first position
    where llama.cpp's routing margin (route.json: experts, indexer blocks) is
    below 2e-5, since there a tiny numeric difference may legitimately pick
    another expert;
 5. requires greedy ids identical over the same rows: the argmax of each row
    that predicts a generated id is that id (llama.cpp chose gen_ids greedily),
    so greedy decoding from the prompt picks the same ids (decode equals batch
    is the model tests' check). Not implied by 4 where two logits are within
    2e-3 of each other.

With --device cuda every run computes on the GPU (the experts streamed through
the CUDA cache), except the direct reader's, which stays on the CPU's host
cache path: the checks are the same, so CUDA's logits are held to llama.cpp's
as the CPU's are (the GPU issues' acceptance), and a machine without a GPU
skips (77, also under XPACK_REQUIRE_FIXTURES).

Exit status: 0 pass, 1 fail, 77 skipped (oracle folder absent; a failure under
XPACK_REQUIRE_FIXTURES=1, as in CI; or --device cuda without a GPU), 2 usage.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

TOL = 1e-3
MARGIN = 2e-5


def skipped():
    """77 (Meson's SKIP); under CI (XPACK_REQUIRE_FIXTURES=1), which always has the oracle, a failure."""
    return 1 if os.environ.get("XPACK_REQUIRE_FIXTURES") == "1" else 77


def reference_name(oracle, model_file, prompt):
    """Logits base name for a model file: shards map to their whole model, and a
    quantized model is compared with its dequantized (-deq) reference."""
    base = re.sub(r"-\d{5}-of-\d{5}$", "", model_file[: -len(".gguf")])
    deq = f"{base}-deq"
    if os.path.exists(os.path.join(oracle, "logits", f"{deq}.{prompt}.seq.f32")):
        return deq
    return base


def first_fragile_position(route):
    """Smallest position where any routing decision had a margin below MARGIN."""
    first = None
    for kind in ("moe", "lid"):
        for layer, rec in (route.get(kind) or {}).items():
            for pos, margin in zip(rec.get("pos", []), rec.get("margin", [])):
                if margin is not None and margin < MARGIN:
                    if first is None or pos < first:
                        first = pos
    return first


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if r.returncode != 0:
        # xpack-run's own refusal when the driver is there but no device is usable
        # (the /dev/nvidiactl test below only sees a machine without a driver).
        if "--device cuda: no CUDA device" in r.stderr:
            print(f"SKIPPED: {r.stderr.strip().splitlines()[-1]}")
            sys.exit(77)
        sys.stderr.write(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}{r.stderr}\n")
        sys.exit(1)
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--xpack-run", required=True)
    ap.add_argument("--xpack-build", required=True)
    ap.add_argument("--oracle", required=True, help="the oracle folder (../shared/oracle)")
    ap.add_argument("--model", required=True, help="file name in ORACLE/models")
    ap.add_argument("--prompt", required=True, choices=["short", "long"])
    ap.add_argument("--cache-mib", default="4", help="budget of the streamed run")
    ap.add_argument("--threads", default=None)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    args.xpack_run = os.path.abspath(args.xpack_run)
    args.xpack_build = os.path.abspath(args.xpack_build)

    if args.device == "cuda" and not os.path.exists("/dev/nvidiactl"):
        print("SKIPPED: --device cuda and no GPU here (/dev/nvidiactl absent)")
        return 77
    if not os.path.isdir(os.path.join(args.oracle, "models")):
        print(f"SKIPPED: oracle folder {args.oracle} absent")
        return skipped()
    model_path = os.path.join(args.oracle, "models", args.model)
    if not os.path.exists(model_path):
        print(f"SKIPPED: {model_path} absent")
        return skipped()

    ref = reference_name(args.oracle, args.model, args.prompt)
    logits_dir = os.path.join(args.oracle, "logits")
    with open(os.path.join(logits_dir, f"{ref}.{args.prompt}.json")) as f:
        meta = json.load(f)
    with open(os.path.join(logits_dir, f"{ref}.{args.prompt}.route.json")) as f:
        route = json.load(f)
    n_vocab = int(meta["n_vocab"])
    ids = list(meta["prompt_ids"]) + list(meta["gen_ids"])
    want = np.fromfile(os.path.join(logits_dir, f"{ref}.{args.prompt}.seq.f32"), dtype="<f4").reshape(-1, n_vocab)
    if want.shape[0] != len(ids):
        print(f"reference has {want.shape[0]} rows for {len(ids)} ids")
        return 1
    fragile = first_fragile_position(route)

    extra = ["--threads", args.threads] if args.threads else []
    device = ["--device", args.device] if args.device != "cpu" else []
    id_arg = ",".join(str(i) for i in ids)
    with tempfile.TemporaryDirectory(prefix="xpack-oracle-") as tmp:
        out = os.path.join(tmp, "m")
        run([args.xpack_build, model_path, "-o", out])
        runs = {}
        counters = {}

        def xrun(name, cmd, on_device=True):
            f32 = os.path.join(tmp, name + ".f32")
            stdout = run([args.xpack_run] + cmd + ["--prompt-ids", id_arg, "-n", "0", "--json", "--logits-out", f32] + extra
                         + (device if on_device else []))
            counters[name] = json.loads(stdout).get("counters", {})
            runs[name] = np.fromfile(f32, dtype="<f4")

        pack = ["-m", out + ".trunk.gguf", "--pack", out + ".xpack"]
        xrun("streamed", pack + ["--cache-mib", args.cache_mib])
        # A budget of top-k + 1 objects: experts stream even when 4 MiB holds them all.
        c = counters["streamed"]
        stride = (int(c["object_bytes"]) + 255) // 256 * 256
        tight = ((int(c["n_experts_used"]) + 1) * stride + 512) / 1048576.0
        xrun("tight", pack + ["--cache-mib", f"{tight:.9f}"])
        resident = pack + ["--cache-mib", "65536"] + (["--preload-experts"] if device else [])
        xrun("resident", resident)
        xrun("plain-gguf", ["-m", model_path])
        # The direct reader feeds the CPU's host cache: on CUDA it is the CPU's run,
        # compared below with llama.cpp's like the others (not bit for bit).
        xrun("direct-reader", pack + ["--cache-mib", args.cache_mib, "--expert-reader", "direct"], on_device=False)

    ok = True
    print(f"{args.model} / {args.prompt} on {args.device}: reference {ref}, {len(ids)} rows")
    for name in ("streamed", "tight", "direct-reader", "resident"):
        c = counters[name]
        print(f"  {name} run ({c.get('source')}): {c.get('cache_misses')} misses, {c.get('cache_evictions')} evictions, "
              f"{c.get('budget_objects')} objects fit the budget")
    identical = ("tight", "resident", "plain-gguf") + (("direct-reader",) if not device else ())
    for name in identical:
        same = runs[name].tobytes() == runs["streamed"].tobytes()
        print(f"  streamed vs {name}: {'bit-identical' if same else 'DIFFERENT'}")
        ok &= same

    checked = len(ids) if fragile is None else fragile
    for name in ("streamed",) + (("direct-reader",) if device else ()):
        ok &= against_reference(name, runs[name], want, n_vocab, checked, fragile)
        ok &= same_greedy_ids(name, runs[name], meta, n_vocab, checked)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def against_reference(name, logits, want, n_vocab, checked, fragile):
    """Every row before the first fragile position within TOL of llama.cpp's."""
    got = logits.reshape(-1, n_vocab)
    if got.shape != want.shape:
        print(f"  {name}: logits shape {got.shape}, expected {want.shape}")
        return False
    row_max = np.abs(got.astype(np.float64) - want.astype(np.float64)).max(axis=1)
    within = int((row_max[:checked] <= TOL).sum())
    bad = [r for r in range(checked) if not row_max[r] <= TOL]
    print(f"  {name}: rows checked: {checked} (first routing margin < {MARGIN}: "
          f"{'none' if fragile is None else 'position %d' % fragile}); within {TOL}: {within}; "
          f"max |diff| over checked rows {row_max[:checked].max() if checked else 0:.3g}, "
          f"over all rows {row_max.max():.3g}")
    if bad:
        print(f"  FAIL: first row over tolerance {bad[0]} (|diff| {row_max[bad[0]]:.3g}); {len(bad)} rows over")
        return False
    return True


def same_greedy_ids(name, logits, meta, n_vocab, checked):
    """Each checked row that predicts a generated id has that id as its argmax."""
    got = logits.reshape(-1, n_vocab)
    first = len(meta["prompt_ids"]) - 1
    gen = list(meta["gen_ids"])
    rows = range(first, min(first + len(gen), checked))
    if got.shape[0] < first + len(gen):
        print(f"  {name}: {got.shape[0]} rows, too few for the {len(gen)} generated ids")
        return False
    ours = got.argmax(axis=1)
    differ = [r for r in rows if int(ours[r]) != int(gen[r - first])]
    same_all = sum(int(ours[first + i]) == int(g) for i, g in enumerate(gen))
    print(f"  {name}: greedy ids: {len(rows) - len(differ)} of {len(rows)} checked rows pick llama.cpp's id "
          f"({same_all} of {len(gen)} over all rows)")
    if differ:
        r = differ[0]
        top = np.sort(got[r])[-2:]
        print(f"  FAIL: row {r} picks {int(ours[r])}, llama.cpp {gen[r - first]} (our top two differ by {top[1] - top[0]:.3g})")
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
