"""Shared fixtures, and the project's skip rule for pytest.

A test that needs something absent calls ``skip_absent(kind, why)``. Like the
doctest suites (test/common/skip.h), a run in which anything was skipped exits
77 (Meson's SKIP) instead of 0, and under XPACK_REQUIRE_FIXTURES=1 (CI) a
missing fixture (kind "fixture": a tool, a model, a package CI always has) fails
instead; a missing capability (a GPU, torch) stays a skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

_skipped = []


def skip_absent(kind: str, why: str) -> None:
    assert kind in ("fixture", "capability")
    if kind == "fixture" and os.environ.get("XPACK_REQUIRE_FIXTURES") == "1":
        pytest.fail(f"required fixture absent (XPACK_REQUIRE_FIXTURES=1): {why}")
    _skipped.append(why)
    pytest.skip(why)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device and torch (meson test python_gpu)")
    config.addinivalue_line("markers", "torch: needs torch, on the CPU (meson test python_torch)")


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 5:  # no test selected (the gpu marker on a build without any): nothing ran
        session.exitstatus = 77
        return
    if exitstatus == 0 and _skipped:
        session.exitstatus = 77


def build_dir() -> Path:
    b = os.environ.get("XPACK_BUILD_DIR") or os.environ.get("XPACK_BUILD_ROOT")
    if not b:
        skip_absent("fixture", "XPACK_BUILD_DIR is not set (the meson build folder with xpack-synth and xpack-build)")
    return Path(b)


def run(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    assert r.returncode == 0, f"{args}: {r.stdout}{r.stderr}"
    return r


@pytest.fixture(scope="session")
def mixtral_pack(tmp_path_factory) -> dict:
    """A synthetic mixtral GGUF (random weights) and its Expert Pack, built by the project's tools."""
    b = build_dir()
    synth, build = b / "tools" / "xpack-synth", b / "tools" / "xpack-build"
    for tool in (synth, build):
        if not tool.exists():
            skip_absent("fixture", f"{tool} not built")
    d = tmp_path_factory.mktemp("pack")
    run(synth, "--arch", "mixtral", "--layers", "3", "--experts", "4", "--top-k", "2", "--embd", "64", "--ff", "64",
        "-q", "-o", d / "m.gguf")
    run(build, d / "m.gguf", "-o", d / "m")
    return {"gguf": d / "m.gguf", "pack": d / "m.xpack", "trunk": d / "m.trunk.gguf", "dir": d}
