#!/usr/bin/env python3
"""The llama.cpp baseline's helpers on made-up trees and bundles (meson test bench_llama_bundle):
bench/llama_perf_cases.py adds the shapes once and refuses a list it does not know;
bench/e2e-setup.sh's e2e_build_llama and bench/llama-kernels.sh take bench/llama-prebuild.sh's
bundle (unpacked, nothing built) and refuse one that lacks a program, whose libraries do not
load, or that is asked for a CPU build. Nothing here needs a GPU, nvcc or llama.cpp."""
import os
import re
import subprocess
import sys
import tarfile
import tempfile

from checks import check, finish

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, "llama_perf_cases.py")
SETUP = os.path.join(HERE, "e2e-setup.sh")
KERNELS = os.path.join(HERE, "llama-kernels.sh")
MARKER = "    // qwen3-30b-a3b\n"


def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def bundle(path, programs):
    """A bundle as llama-prebuild.sh packs it: b/PREBUILT.txt and b/bin/PROGRAM, each a script
    that prints its name and arguments."""
    with tempfile.TemporaryDirectory() as src:
        write(os.path.join(src, "b", "PREBUILT.txt"), "made up\n")
        for p in programs:
            write(os.path.join(src, "b", "bin", p), f'#!/bin/sh\necho "{p} $* [graphs off: ${{GGML_CUDA_DISABLE_GRAPHS:-}}]"\n',
                  0o755)
        with tarfile.open(path, "w:gz") as t:
            t.add(os.path.join(src, "b"), arcname="b")


def build_llama(d, tarball, sub, cuda, *targets, path=None):
    env = dict(os.environ)
    if path:
        env["PATH"] = path + os.pathsep + env["PATH"]
    script = (f'. "{SETUP}"; dir="$1" tarball="$2" out="$1/out"; mkdir -p "$out/logs"; '
              'shift 2; e2e_build_llama "$@"')
    return subprocess.run(["bash", "-c", script, "sh", d, tarball, sub, cuda, *targets],
                          capture_output=True, text=True, env=env)


with tempfile.TemporaryDirectory() as d:
    # llama_perf_cases.py: the cases go right before the marker, once.
    tree = os.path.join(d, "src")
    cpp = os.path.join(tree, "tests", "test-backend-ops.cpp")
    write(cpp, "a\n" + MARKER + "b\n")
    r = subprocess.run([sys.executable, CASES, tree], capture_output=True, text=True)
    text = open(cpp).read()
    check(r.returncode == 0, f"perf cases added (rc {r.returncode}: {r.stderr})")
    check(text.count("GGML_TYPE_Q2_K, GGML_TYPE_F32, 3072, bs, 3584") == 1, "Kimi-K3's Q2_K expert shape added")
    check(text.count("GGML_TYPE_MXFP4, GGML_TYPE_F32, 32768, bs, 16384") == 1, "the matrix larger than the L2")
    check(text.count("test_mul_mat_id(GGML_TYPE_MXFP4, GGML_TYPE_F32, 256, 6, false, 2048, bs, 4096)") == 1,
          "DeepSeek-V4's routed experts as one grouped product")
    check(text.count("test_mul_mat_id(GGML_TYPE_Q3_K, GGML_TYPE_F32, 32, 16, false, 3584, 1, 3072)") == 1,
          "Kimi-K3's one-token step from a pool of 32")
    check(text.index("test_mul_mat") < text.index(MARKER) and text.endswith(MARKER + "b\n"), "before the marker")
    r = subprocess.run([sys.executable, CASES, tree], capture_output=True, text=True)
    check(r.returncode == 0 and open(cpp).read() == text, "a second run changes nothing")
    older = text.replace("3584, 1, 3072)", "3584, 8, 3072)")
    write(cpp, older)
    r = subprocess.run([sys.executable, CASES, tree], capture_output=True, text=True)
    check(r.returncode == 0 and open(cpp).read() == text, "an earlier list of ours is replaced, not added to")
    write(cpp, "a list without the marker\n")
    r = subprocess.run([sys.executable, CASES, tree], capture_output=True, text=True)
    check(r.returncode == 1 and "perf case list changed" in r.stderr, f"unknown list refused (rc {r.returncode})")
    r = subprocess.run([sys.executable, CASES, os.path.join(d, "none")], capture_output=True, text=True)
    check(r.returncode == 1 and "No such file" in r.stderr, f"missing tree refused (rc {r.returncode})")

    # e2e_build_llama with a bundle: unpacked into DIR/llama.cpp/b, nothing built.
    good = os.path.join(d, "good.tar.gz")
    bundle(good, ["llama-bench", "llama-completion", "test-backend-ops"])
    e2e = os.path.join(d, "e2e")
    r = build_llama(e2e, good, "b", "ON", "llama-completion", "llama-bench")
    check(r.returncode == 0, f"bundle unpacked (rc {r.returncode}: {r.stdout}{r.stderr})")
    check(os.access(os.path.join(e2e, "llama.cpp", "b", "bin", "llama-bench"), os.X_OK), "llama-bench in place")
    check(not os.path.exists(os.path.join(e2e, "llama.cpp", "CMakeLists.txt")), "no sources, no build")
    r = build_llama(os.path.join(d, "e2e-cpu"), good, "b-cpu", "OFF", "llama-bench")
    check(r.returncode == 1 and "not b-cpu" in r.stdout, f"a CPU build refused (rc {r.returncode}: {r.stdout})")
    partial = os.path.join(d, "partial.tar.gz")
    bundle(partial, ["llama-bench"])
    r = build_llama(os.path.join(d, "e2e-partial"), partial, "b", "ON", "llama-completion", "llama-bench")
    check(r.returncode == 1 and "has no llama-completion" in r.stdout, f"a missing program (rc {r.returncode})")
    # A library that does not load (ldd's "not found", here from a made-up ldd): refused and
    # removed, so the next call does not take it for built.
    fake = os.path.join(d, "fakebin")
    write(os.path.join(fake, "ldd"), '#!/bin/sh\necho "\tlibcublas.so.13 => not found"\n', 0o755)
    broken = os.path.join(d, "e2e-broken")
    r = build_llama(broken, good, "b", "ON", "llama-bench", path=fake)
    check(r.returncode == 1 and "cannot load" in r.stdout and "libcublas" in r.stdout,
          f"libraries that do not load refused (rc {r.returncode}: {r.stdout})")
    check(not os.path.exists(os.path.join(broken, "llama.cpp", "b")), "the broken unpack removed")

    # llama-kernels.sh with a bundle runs its test-backend-ops, the MUL_MAT perf filter passed.
    r = subprocess.run(["bash", KERNELS, good, os.path.join(d, "lk")], capture_output=True, text=True)
    check(r.returncode == 0 and r.stdout.startswith("test-backend-ops perf -o MUL_MAT -b CUDA0 -p type_a="),
          f"llama-kernels ran the prebuilt program (rc {r.returncode}: {r.stdout}{r.stderr})")
    check("\ntest-backend-ops perf -o MUL_MAT_ID -b CUDA0 -p type_a=" in r.stdout, "and its grouped experts")
    check(r.stdout.count("[graphs off: 1]") == 3, "its CUDA graphs off")
    # Each filter is a std::regex_search over a case's vars() text; these are that text, as
    # test-backend-ops' VARS_TO_STR prints it (MUL_MAT_ID's ends at k: no trailing comma).
    filters = re.findall(r"-p (\S+) \[graphs", r.stdout)
    check(len(filters) == 3 and re.search(filters[0], "type_a=q3_K,type_b=f32,m=3072,n=8,k=3584,bs=[1,1],"
                                          "nr=[1,1],per=[0,1,2,3],k_v=0,o=1")
          and not re.search(filters[0], "type_a=q4_0,type_b=f32,m=3072,n=8,k=3584,bs=[1,1],nr=[1,1],"),
          f"the MUL_MAT filter takes a real case and only the measured types ({filters})")
    check(len(filters) == 3 and re.search(filters[1], "type_a=q2_K,type_b=f32,n_mats=32,n_used=16,b=0,m=3072,n=1,k=3584")
          and not re.search(filters[1], "type_a=q2_K,type_b=f32,n_mats=384,n_used=16,b=0,m=3072,n=1,k=3584"),
          f"the small pool's filter takes Kimi-K3's one-token case alone ({filters})")
    check(len(filters) == 3 and re.search(filters[2], "type_a=mxfp4,type_b=f32,n_mats=256,n_used=6,b=0,m=2048,n=1,k=4096")
          and re.search(filters[2], "type_a=q2_K,type_b=f32,n_mats=384,n_used=16,b=0,m=3072,n=8,k=3584")
          and not re.search(filters[2], "type_a=mxfp4,type_b=f32,n_mats=256,n_used=6,b=0,m=2048,n=1,k=40960"),
          f"the MUL_MAT_ID filter takes the routed experts' cases ({filters})")
    r = subprocess.run(["bash", KERNELS, "--graphs", good, os.path.join(d, "lk3")], capture_output=True, text=True)
    check(r.returncode == 0 and r.stdout.startswith("test-backend-ops perf -o MUL_MAT") and
          r.stdout.count("[graphs off: ]") == 3, f"--graphs: on (rc {r.returncode}: {r.stdout})")
    r = subprocess.run(["bash", KERNELS, "--graphs"], capture_output=True, text=True)
    check(r.returncode == 2 and "usage" in r.stderr, f"no tarball: a usage error (rc {r.returncode})")
    r = subprocess.run(["bash", KERNELS, good, os.path.join(d, "lk2")], capture_output=True, text=True,
                       env=dict(os.environ, PATH=fake + os.pathsep + os.environ["PATH"]))
    check(r.returncode == 1 and "cannot load" in r.stderr, f"llama-kernels refuses what does not load (rc {r.returncode})")

finish()
