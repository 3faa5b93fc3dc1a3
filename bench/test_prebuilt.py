#!/usr/bin/env python3
"""bench/prebuilt.py and gpu-suites.sh --prebuilt's unpacking, on a made-up Meson project
(meson test bench_prebuilt): a test of suite cuda whose executable loads a shared library
of the build and reads a file the environment names, a test of another suite, and a test
that depends on a second executable. The bundle carries what the chosen suite's tests need
and nothing else (--test: only the tests of matching names); unpacked into a fresh
configured (never built) build of the same project, `meson test --no-rebuild` passes
there; a target not built is refused; usage errors exit 2.
Needs meson, ninja and a C compiler (the test suite's own build needs them too)."""
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

from checks import check, finish

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "prebuilt.py")

MESON = """project('pb', 'c')
lib = shared_library('mathy', 'lib.c', version : '1.2.3')
exe = executable('needs_lib', 'main.c', link_with : lib)
helper = executable('helper', 'helper.c')
other = executable('other', 'helper.c')
data = configure_file(output : 'data.txt', configuration : {'X' : '7'}, input : 'data.in')
test('gpu_like', exe, env : {'PB_DATA' : meson.current_build_dir() / 'data.txt'}, suite : 'cuda')
test('with_helper', exe, args : ['--helper'], depends : helper, env : {'PB_DATA' : meson.current_build_dir() / 'data.txt'},
  suite : 'cuda')
test('elsewhere', other, suite : 'unit')
"""
FILES = {
    "lib.c": "int mathy(int x) { return 6 * x; }\n",
    "main.c": """#include <stdio.h>
#include <stdlib.h>
int mathy(int);
int main(int argc, char** argv) {
  FILE* f = fopen(getenv("PB_DATA"), "r");
  int x = 0;
  if (!f || fscanf(f, "%d", &x) != 1) return 3;
  (void)argc; (void)argv;
  return mathy(x) == 42 ? 0 : 1;
}
""",
    "helper.c": "int main(void) { return 0; }\n",
    "data.in": "@X@\n",
}


def run(*cmd, cwd=None, env=None):
    return subprocess.run(list(cmd), capture_output=True, text=True, cwd=cwd, env=env)


if not shutil.which("meson") or not shutil.which("ninja") or not shutil.which("cc"):
    print("SKIP: meson, ninja and cc are needed")
    sys.exit(77)

with tempfile.TemporaryDirectory() as d:
    src = os.path.join(d, "src")
    os.makedirs(src)
    with open(os.path.join(src, "meson.build"), "w") as f:
        f.write(MESON)
    for name, text in FILES.items():
        with open(os.path.join(src, name), "w") as f:
            f.write(text)
    here = os.path.join(src, "build")
    r = run("meson", "setup", here, src)
    check(r.returncode == 0, f"meson setup: {r.stderr[-400:]}")
    bundle = os.path.join(d, "pb.tar.xz")
    # Configured, not built: refused, naming the missing file.
    r = run(sys.executable, TOOL, here, bundle, "--suite", "cuda")
    check(r.returncode == 1 and "is not built" in r.stderr, f"an unbuilt target refused (rc {r.returncode}: {r.stderr})")
    r = run("ninja", "-C", here)
    check(r.returncode == 0, f"ninja: {r.stdout[-400:]}")
    r = run(sys.executable, TOOL, here, bundle, "--suite", "cuda")
    check(r.returncode == 0 and "2 tests" in r.stdout, f"packed (rc {r.returncode}: {r.stdout} {r.stderr})")
    names = set()
    if os.path.exists(bundle):
        with tarfile.open(bundle) as t:
            members = {m.name.lstrip("./"): m for m in t.getmembers()}
        names = set(members)
        check({"needs_lib", "helper", "data.txt", "libmathy.so.1", "libmathy.so.1.2.3",
               "prebuilt-lib/PREBUILT.txt"} <= names, f"what the cuda tests need: {sorted(names)}")
        check("other" not in names, "another suite's executable left out")
        check("libmathy.so.1" in members and members["libmathy.so.1"].issym(), "the soname carried as a link")
        check(members.get("needs_lib") is not None and members["needs_lib"].size < os.path.getsize(
            os.path.join(here, "needs_lib")), "executables stripped")
    # The GPU machine's side: the same sources configured anew elsewhere (never built),
    # the bundle unpacked into it, the tests run without a build.
    there_src = os.path.join(d, "there")
    shutil.copytree(src, there_src, ignore=shutil.ignore_patterns("build"))
    there = os.path.join(there_src, "build")
    r = run("meson", "setup", there, there_src)
    check(r.returncode == 0, "configured there")
    with tarfile.open(bundle) as t:
        t.extractall(there)
    r = run("meson", "test", "-C", there, "--no-rebuild", "--suite", "cuda")
    check(r.returncode == 0 and re.search(r"^Ok:\s+2\s*$", r.stdout, re.M) is not None,
          f"the cuda suite passes from the bundle: {r.stdout[-600:]}")
    # --test: only the matching tests of the suite (with_helper's helper left out).
    only = os.path.join(d, "only.tar.xz")
    r = run(sys.executable, TOOL, here, only, "--suite", "cuda", "--test", "gpu_*")
    check(r.returncode == 0 and "1 tests" in r.stdout, f"--test packed one test (rc {r.returncode}: {r.stdout} {r.stderr})")
    if os.path.exists(only):
        with tarfile.open(only) as t:
            got = {m.name.lstrip("./") for m in t.getmembers()}
        check("needs_lib" in got and "helper" not in got, f"--test gpu_* carries gpu_like's files only: {sorted(got)}")
    r = run(sys.executable, TOOL, here, only, "--suite", "cuda", "--test", "elsewhere")
    check(r.returncode == 1 and "no test named elsewhere" in r.stderr, "--test of another suite's test matches none")
    # Usage errors and a suite without tests.
    r = run(sys.executable, TOOL, os.path.join(d, "nope"), bundle)
    check(r.returncode == 2 and "not a configured build" in r.stderr, "a missing build directory")
    r = run(sys.executable, TOOL, here, bundle, "--suite", "nosuch")
    check(r.returncode == 1 and "no test of suite nosuch" in r.stderr, "a suite with no test")
    r = run(sys.executable, TOOL, here, bundle, "--also", "missing.bin")
    check(r.returncode == 1 and "--also missing.bin" in r.stderr, "--also names a missing file")
    r = run(sys.executable, TOOL, "--help")
    check(r.returncode == 0 and "usage" in r.stdout.lower(), "--help")

finish()
