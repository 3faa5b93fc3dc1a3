#!/usr/bin/env python3
"""Packs what the tests of some suites run, from a CUDA build made on this (CPU) machine,
so that the GPU machine runs them without building (bench/gpu-suites.sh --prebuilt).

usage: bench/prebuilt.py BUILD OUT.tar.xz [--suite NAME ...] [--test GLOB ...] [--also PATH ...]
  BUILD: a build directory configured with -Dcuda=enabled and built (ninja -C BUILD)
  OUT.tar.xz: the bundle; its paths are BUILD's own, so it unpacks into the GPU
    machine's build directory of the same checkout (configured there, not built)
  --suite NAME: the suites whose tests it carries (default: cuda and python)
  --test GLOB: of those, only the tests whose names match (fnmatch; e.g. 'cuda_kimi*'),
    for a bundle that leaves room in the carry for large fixtures
  --also PATH: one more file of BUILD to carry (e.g. bench/bench-kernels)

What a test runs is read from Meson (`meson introspect --tests --targets`): its command's
files inside BUILD, the targets it depends on and the files its environment names inside
BUILD. Executables and shared libraries are stripped. The shared libraries they load from
outside BUILD that the GPU machine lacks (libcpp-httplib; .deps brings liburing and
xxHash) go to prebuilt-lib/, which gpu-suites.sh puts on LD_LIBRARY_PATH. Exit status 0;
1 when BUILD was not built or a file is missing; 2 on a usage error."""
import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

# Libraries of this machine that the GPU machine (Ubuntu 24.04 with .deps) does not have.
MISSING_THERE = ("libcpp-httplib.so",)


def fail(msg, code=1):
    print(f"prebuilt: {msg}", file=sys.stderr)
    sys.exit(code)


def introspect(build, what):
    r = subprocess.run(["meson", "introspect", what, build], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"meson introspect {what} {build}: {r.stderr.strip() or r.stdout.strip()}")
    return json.loads(r.stdout)


def inside(path, build):
    p = os.path.realpath(path)
    return p == build or p.startswith(build + os.sep)


def files_of_tests(build, suites, names=None):
    """The files inside BUILD that the chosen suites' tests need, as paths relative to it."""
    tests = introspect(build, "--tests")
    targets = {t["id"]: t for t in introspect(build, "--targets")}
    want = set()
    chosen = [t for t in tests if any(s.split(":")[-1] in suites for s in t["suite"])]
    if names:
        chosen = [t for t in chosen if any(fnmatch.fnmatchcase(t["name"], g) for g in names)]
    if not chosen:
        which = f" named {', '.join(names)}" if names else ""
        fail(f"no test{which} of suite {', '.join(sorted(suites))} in {build} (built with -Dcuda=enabled?)")
    for t in chosen:
        # The build's files that its command and environment name.
        words = list(t["cmd"]) + [part for value in t["env"].values() for part in value.split(os.pathsep)]
        want |= {os.path.abspath(w) for w in words if os.path.isabs(w) and inside(w, build) and os.path.isfile(w)}
        for dep in t["depends"]:
            for f in targets.get(dep, {}).get("filename", []):
                if inside(f, build):
                    if not os.path.exists(f):
                        fail(f"{f} is not built (ninja -C {build} first)")
                    want.add(os.path.abspath(f))
    return chosen, want


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def libraries(path, build):
    """The shared libraries path loads: those inside BUILD (with their symlinks), and
    those of this machine that the GPU machine lacks."""
    r = subprocess.run(["ldd", path], capture_output=True, text=True)
    ours, foreign = set(), set()
    for line in r.stdout.splitlines():
        if "=>" not in line:
            continue
        name, rest = (s.strip() for s in line.split("=>", 1))
        lib = rest.split(" (")[0].strip()
        if not lib.startswith("/"):
            continue
        if inside(lib, build):
            ours.add(os.path.abspath(lib))
        elif name.startswith(MISSING_THERE):
            foreign.add(lib)
    return ours, foreign


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("out")
    ap.add_argument("--suite", action="append", default=None)
    ap.add_argument("--test", action="append", default=None)
    ap.add_argument("--also", action="append", default=[])
    a = ap.parse_args()
    build = os.path.realpath(a.build)
    if not os.path.isfile(os.path.join(build, "build.ninja")):
        fail(f"{a.build} is not a configured build directory", 2)
    suites = set(a.suite or ["cuda", "python"])
    chosen, want = files_of_tests(build, suites, a.test)
    for extra in a.also:
        p = os.path.join(build, extra)
        if not os.path.isfile(p):
            fail(f"--also {extra}: no such file in {a.build}")
        want.add(os.path.abspath(p))
    foreign = set()
    for f in list(want):
        if os.path.isfile(f) and is_elf(f):
            ours, theirs = libraries(f, build)
            want |= ours
            foreign |= theirs
    # A library's soname link is carried as a link, beside the file it names.
    want |= {os.path.realpath(f) for f in want if os.path.islink(f)}
    with tempfile.TemporaryDirectory() as stage:
        for f in sorted(want):
            dst = os.path.join(stage, os.path.relpath(f, build))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.islink(f):
                os.symlink(os.path.relpath(os.path.realpath(f), os.path.dirname(f)), dst)
            elif is_elf(f):
                r = subprocess.run(["strip", "--strip-unneeded", "-o", dst, f], capture_output=True, text=True)
                if r.returncode != 0:
                    fail(f"strip {f}: {r.stderr.strip()}")
                shutil.copymode(f, dst)
            else:
                shutil.copy2(f, dst)
        os.makedirs(os.path.join(stage, "prebuilt-lib"), exist_ok=True)
        for lib in sorted(foreign):
            shutil.copy2(os.path.realpath(lib), os.path.join(stage, "prebuilt-lib", os.path.basename(lib)))
        with open(os.path.join(stage, "prebuilt-lib", "PREBUILT.txt"), "w") as f:
            f.write("tests: " + " ".join(t["name"] for t in chosen) + "\n")
            f.write("files: " + " ".join(sorted(os.path.relpath(p, build) for p in want)) + "\n")
        with tarfile.open(a.out, "w:xz") as tar:
            for name in sorted(os.listdir(stage)):
                tar.add(os.path.join(stage, name), arcname=name)
    print(f"prebuilt: {a.out}: {len(chosen)} tests, {len(want)} files of {a.build}, "
          f"{len(foreign)} libraries of this machine, {os.path.getsize(a.out) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
