#!/usr/bin/env python3
"""bench/kernel-table.py on made-up logs: ours joined with test-backend-ops' MUL_MAT times
(with its CUDA graphs off, and on: warm-up messages between a case and its time) and its
MUL_MAT_ID times (our hot grouped launch of n * n_used one-token products); rows without a
match keep '-'."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, "kernel-table.py")
failed = 0


def check(ok, what):
    global failed
    if not ok:
        failed += 1
        print(f"FAILED: {what}")


OURS = """device: made up
launches: one CUDA graph a measurement, replayed (--graph)
RESULT kind=copy bytes=1073741824 us=700.0 copy_GBps=3068
RESULT kind=matvec type=mxfp4 m=2048 n=1 k=4096 mode=hot us=8.00 weight_GBps=550 copy_pct=18.0 shape=e
RESULT kind=matvec type=q2_K m=3072 n=8 k=3584 mode=hot us=20.00 weight_GBps=180 copy_pct=5.9 shape=e
RESULT kind=matvec type=q3_K m=3584 n=1 k=3072 mode=hot us=9.00 weight_GBps=520 copy_pct=17.0 shape=e
RESULT kind=grouped type=mxfp4 m=2048 n=1 k=4096 mode=grouped6 us=30.00 weight_GBps=900 copy_pct=29.3 shape=e
RESULT kind=grouped type=mxfp4 m=2048 n=1 k=4096 mode=grouped6-hot us=24.00 weight_GBps=1100 copy_pct=35.9 shape=e
RESULT kind=grouped type=mxfp4 m=2048 n=1 k=4096 mode=grouped48 us=150.00 weight_GBps=1400 copy_pct=45.6 shape=e
RESULT kind=grouped type=mxfp4 m=2048 n=1 k=4096 mode=grouped48-hot us=120.00 weight_GBps=1700 copy_pct=55.4 shape=e
"""
LLAMA = """  MUL_MAT(type_a=mxfp4,type_b=f32,m=2048,n=1,k=4096,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1):   1000 runs -     4.00 us/run - 1 MFLOP/run
  MUL_MAT(type_a=q2_K,type_b=f32,m=3072,n=8,k=3584,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1): ggml_backend_cuda_graph_compute: CUDA graph warmup reset
ggml_backend_cuda_graph_compute: CUDA graph warmup complete
               2000 runs -    40.00 us/run - 1 MFLOP/run
  MUL_MAT(type_a=q3_K,type_b=f32,m=3584,n=1,k=3072,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1): not supported
  MUL_MAT_ID(type_a=mxfp4,type_b=f32,n_mats=256,n_used=6,b=0,m=2048,n=8,k=4096):   500 runs -    60.00 us/run - 1 MFLOP/run
  MUL_MAT_ID(type_a=mxfp4,type_b=f32,n_mats=256,n_used=6,b=0,m=2048,n=1,k=4096):   500 runs -    12.00 us/run - 1 MFLOP/run
"""

with tempfile.TemporaryDirectory() as d:
    ours, llama = os.path.join(d, "ours.log"), os.path.join(d, "llama.log")
    open(ours, "w").write(OURS)
    open(llama, "w").write(LLAMA)
    r = subprocess.run([sys.executable, TABLE, ours, llama], capture_output=True, text=True)
    check(r.returncode == 0, f"ran (rc {r.returncode}: {r.stderr})")
    rows = {(l.split()[0], l.split()[1], l.split()[3], l.split()[4]): l.split() for l in r.stdout.splitlines()
            if l.startswith(("matvec", "grouped"))}
    check("copy bandwidth (D2D, read+write): 3068 GB/s" in r.stdout, "the copy line")
    check("replayed (--graph)" in r.stdout, "how ours were launched")
    check(rows[("matvec", "mxfp4", "1", "hot")][-1] == "0.50x", "graphs off: llama 4 us against our 8")
    check(rows[("matvec", "q2_K", "8", "hot")][-1] == "2.00x", "graphs on: the time after the warm-up lines")
    check(rows[("matvec", "q3_K", "1", "hot")][-1] == "-", "an unsupported case has no time")
    check(rows[("grouped", "mxfp4", "1", "grouped6-hot")][-1] == "0.50x", "MUL_MAT_ID 1 token x 6 = grouped6, hot")
    check(rows[("grouped", "mxfp4", "1", "grouped48-hot")][-1] == "0.50x", "MUL_MAT_ID 8 tokens x 6 = grouped48, hot")
    check(rows[("grouped", "mxfp4", "1", "grouped6")][-1] == "-", "the rotating (cold) launch has no llama time")
    r = subprocess.run([sys.executable, TABLE, ours], capture_output=True, text=True)
    check(r.returncode == 0 and "llama" in r.stdout and "0.50x" not in r.stdout, "ours alone: no ratios")
    r = subprocess.run([sys.executable, TABLE, "--help"], capture_output=True, text=True)
    check(r.returncode == 0 and "usage: bench/kernel-table.py" in r.stdout, "--help")
    r = subprocess.run([sys.executable, TABLE], capture_output=True, text=True)
    check(r.returncode == 2 and "usage:" in r.stderr, "no log: a usage error")
    r = subprocess.run([sys.executable, TABLE, ours + ".missing"], capture_output=True, text=True)
    check(r.returncode == 1 and "kernel-table:" in r.stderr and "Traceback" not in r.stderr, "a missing log named")

if failed:
    sys.exit(1)
print("all checks passed")
