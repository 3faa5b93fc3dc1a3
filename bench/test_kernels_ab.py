#!/usr/bin/env python3
"""bench/kernels_ab.py and bench/kernels-ab.sh's refusals on made-up input (meson test
bench_kernels_ab): medians, speed-ups, measurements one side lacks, a side with no result,
and the script's usage errors. Nothing here needs a GPU or a build."""
import os
import subprocess
import sys
import tempfile

from checks import check, finish

HERE = os.path.dirname(os.path.abspath(__file__))
JOIN = os.path.join(HERE, "kernels_ab.py")
SCRIPT = os.path.join(HERE, "kernels-ab.sh")


def line(kind, typ, us, n=1, mode="cold", shape="s"):
    return (f"RESULT kind={kind} type={typ} m=4096 n={n} k=14336 mode={mode} us={us} weight_GBps=1 "
            f"copy_pct=1.0 shape={shape}\n")


def write(d, name, text):
    p = os.path.join(d, name)
    with open(p, "w") as f:
        f.write(text)
    return p


with tempfile.TemporaryDirectory() as d:
    copy = "RESULT kind=copy bytes=1073741824 us=503.9 copy_GBps=4262\n"
    # A: 100, 104, 102 us (median 102); B: 50, 52 (median 51): 2.000x. A second measurement
    # in A only, one in B only, and noise lines that are not results.
    a1 = write(d, "a1", "device: x\n" + copy + line("matvec", "q2_K", 100) + line("matvec", "mxfp4", 10))
    a2 = write(d, "a2", copy + line("matvec", "q2_K", 104) + "garbage RESULT kind=\n")
    a3 = write(d, "a3", line("matvec", "q2_K", 102))
    b1 = write(d, "b1", copy + line("matvec", "q2_K", 50) + line("matmul-mma", "q2_K", 7, n=8))
    b2 = write(d, "b2", copy + line("matvec", "q2_K", 52))
    r = subprocess.run([sys.executable, JOIN, "--label-a", "old", "--label-b", "new", "--a", a1, a2, a3,
                        "--b", b1, b2], capture_output=True, text=True)
    out = r.stdout
    check(r.returncode == 0, f"join exit 0 (got {r.returncode}: {r.stderr})")
    row = [l for l in out.splitlines() if l.startswith("matvec") and "q2_K" in l]
    check(len(row) == 1, "one q2_K matvec row")
    if row:
        check("102.00 (3)" in row[0] and "51.00 (2)" in row[0], f"medians and run counts: {row[0]}")
        check("2.000x" in row[0], f"speed-up A/B: {row[0]}")
    check(any("mxfp4" in l and "only old" in l for l in out.splitlines()), "a measurement only A has")
    check(any("matmul-mma" in l and "only new" in l for l in out.splitlines()), "a measurement only B has")
    check("old copy GB/s: 4262, 4262" in out and "new copy GB/s: 4262, 4262" in out, "copy bandwidth per side")
    check("1 measurements on both sides: speed-up 2.000x to 2.000x" in out, "summary line")
    # A side without any result: exit 2, named.
    empty = write(d, "empty", "bench-kernels: no CUDA device\n")
    r = subprocess.run([sys.executable, JOIN, "--a", a1, "--b", empty], capture_output=True, text=True)
    check(r.returncode == 2 and "B: no RESULT line" in r.stderr, f"empty side refused (rc {r.returncode})")

    # The script's usage errors, before anything is built.
    def sh(*args):
        return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True)

    r = sh("--help")
    check(r.returncode == 0 and "--against TREE" in r.stdout, "--help")
    r = sh()
    check(r.returncode == 2 and "--against TREE or --switch FLAGS is required" in r.stderr, "no --against")
    r = sh("--against", os.path.join(d, "nope"))
    check(r.returncode == 2 and "no such file" in r.stderr, "missing baseline")
    r = sh("--against", d, "--rounds", "0")
    check(r.returncode == 2 and "--rounds" in r.stderr, "--rounds 0")
    r = sh("--against", d, "--jobs", "x")
    check(r.returncode == 2 and "--jobs" in r.stderr, "--jobs x")
    r = sh("--bogus")
    check(r.returncode == 2 and "unknown argument" in r.stderr, "unknown argument")
    r = sh("--against", d, "--out", os.path.join(d, "o"))
    check(r.returncode == 1 and "no meson.build" in r.stderr, f"a baseline without meson.build (rc {r.returncode})")
    r = sh("--against", os.path.dirname(HERE), "--out", os.path.join(d, "o"))
    check(r.returncode == 2 and "this tree itself" in r.stderr, f"the tree against itself (rc {r.returncode})")

    # --switch: one executable against itself, B with the flags added, alternately. A
    # made-up bench-kernels logs its arguments and is twice as fast with the switch.
    fake = write(d, "fake-bench", """#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls"
us=100; case " $* " in *" --f32-variant 1 "*) us=50 ;; esac
echo "RESULT kind=copy bytes=1 us=1 copy_GBps=3000"
echo "RESULT kind=matvec type=f32 m=4096 n=1 k=14336 mode=cold us=$us weight_GBps=1 copy_pct=1.0 shape=s"
""")
    os.chmod(fake, 0o755)
    out_dir = os.path.join(d, "sw")
    r = sh("--switch", "--f32-variant 1", "--bench", fake, "--rounds", "2", "--out", out_dir, "--",
           "--quick", "--type", "f32")
    check(r.returncode == 0, f"--switch runs (rc {r.returncode}: {r.stderr})")
    calls = open(os.path.join(d, "calls")).read().splitlines() if os.path.exists(os.path.join(d, "calls")) else []
    check(calls == ["--quick --type f32", "--quick --type f32 --f32-variant 1"] * 2,
          f"alternate A, B, A, B; B alone with the switch: {calls}")
    check("2.000x" in r.stdout and "A copy GB/s: 3000, 3000" in r.stdout, f"the table: {r.stdout}")
    check(os.path.exists(os.path.join(out_dir, "ab.txt")), "the table kept in --out")
    r = sh("--switch", "", "--bench", fake)
    check(r.returncode == 2 and "--switch: the flags" in r.stderr, "an empty switch")
    r = sh("--switch", "--x", "--against", d)
    check(r.returncode == 2 and "not both" in r.stderr, "--switch with --against")
    r = sh("--switch", "--x", "--bench", os.path.join(d, "nope"))
    check(r.returncode == 2 and "not an executable" in r.stderr, "--bench missing")
    r = sh("--against", d, "--bench", fake)
    check(r.returncode == 2 and "goes with --switch" in r.stderr, "--bench without --switch")
    # A run that fails is named, and nothing is joined.
    bad = write(d, "bad-bench", "#!/bin/sh\necho boom\nexit 3\n")
    os.chmod(bad, 0o755)
    r = sh("--switch", "--x", "--bench", bad, "--out", os.path.join(d, "sw2"))
    check(r.returncode == 1 and "side a, round 1 failed" in r.stderr, f"a failed run (rc {r.returncode})")

finish()
