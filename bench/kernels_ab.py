#!/usr/bin/env python3
"""Joins bench-kernels runs of two builds, taken alternately in one call, into one table:
each measurement's median per build and the speed-up of B over A (A's us / B's us; above
1: B is faster). bench/kernels-ab.sh runs the builds and calls this.

usage: bench/kernels_ab.py [--label-a NAME] [--label-b NAME] --a LOG [LOG ...] --b LOG [LOG ...]
A measurement is one RESULT line's kind, type, m, n, k, mode and shape; a measurement that
only one side printed is listed as such (a shape one build lacks), never matched to another.
The copy bandwidth each run measured is printed per side (a large gap between the sides
says the machine changed between runs, and the ratios with it). Exit status: 0, or 2 when a
side has no RESULT line at all (a build or run that failed)."""
import argparse
import statistics
import sys

KEY = ("kind", "type", "m", "n", "k", "mode", "shape")


def parse(paths):
    """Per measurement, the us of every run (in file order); and every run's copy GB/s."""
    runs, copies = {}, []
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                if not line.startswith("RESULT "):
                    continue
                d = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
                if d.get("kind") == "copy":
                    if "copy_GBps" in d:
                        copies.append(float(d["copy_GBps"]))
                    continue
                if not all(k in d for k in KEY + ("us",)):
                    continue
                runs.setdefault(tuple(d[k] for k in KEY), []).append(float(d["us"]))
    return runs, copies


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", nargs="+", required=True, help="bench-kernels logs of build A (the baseline)")
    ap.add_argument("--b", nargs="+", required=True, help="bench-kernels logs of build B (the change)")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    args = ap.parse_args(argv)
    a, copy_a = parse(args.a)
    b, copy_b = parse(args.b)
    for label, runs in ((args.label_a, a), (args.label_b, b)):
        if not runs:
            print(f"kernels_ab: {label}: no RESULT line in its logs (did its build or run fail?)", file=sys.stderr)
            return 2

    def copies(label, c):
        return f"{label} copy GB/s: " + (", ".join(f"{v:.0f}" for v in c) if c else "not measured")

    print(copies(args.label_a, copy_a) + "; " + copies(args.label_b, copy_b))
    hdr = (f"{'kind':<15}{'type':<7}{'inputs x rows':<16}{'n':>4} {'mode':<14}"
           f"{args.label_a + ' us':>12}{args.label_b + ' us':>12}{'speed-up':>10}  shape")
    print(hdr)
    print("-" * len(hdr))
    ratios = []
    for key in list(a) + [k for k in b if k not in a]:
        kind, typ, m, n, k, mode, shape = key
        ua, ub = a.get(key), b.get(key)
        ma = statistics.median(ua) if ua else None
        mb = statistics.median(ub) if ub else None
        ratio = ma / mb if ma and mb else None
        if ratio:
            ratios.append(ratio)
        cell = lambda v, runs: f"{v:.2f}" + (f" ({len(runs)})" if runs and len(runs) > 1 else "") if v else "-"
        print(f"{kind:<15}{typ:<7}{k + 'x' + m:<16}{n:>4} {mode:<14}{cell(ma, ua):>12}{cell(mb, ub):>12}"
              f"{(f'{ratio:.3f}x' if ratio else 'only ' + (args.label_a if ua else args.label_b)):>10}  {shape}")
    if ratios:
        print(f"{len(ratios)} measurements on both sides: speed-up {min(ratios):.3f}x to {max(ratios):.3f}x, "
              f"geometric mean {statistics.geometric_mean(ratios):.3f}x (medians of each side's runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
