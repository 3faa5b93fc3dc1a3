"""Meson's entry to the pytest suite: exit 77 (SKIP) saying why when pytest or
numpy is absent (a failure under XPACK_REQUIRE_FIXTURES=1, as in CI)."""

import importlib.util
import os
import sys

missing = [m for m in ("pytest", "numpy") if importlib.util.find_spec(m) is None]
if missing:
    why = f"python3 ({sys.executable}) lacks {', '.join(missing)}"
    if os.environ.get("XPACK_REQUIRE_FIXTURES") == "1":
        print(f"FAIL: {why} (XPACK_REQUIRE_FIXTURES=1)")
        sys.exit(1)
    print(f"SKIP: {why}")
    sys.exit(77)

import pytest  # noqa: E402

# argv[1:]: a marker expression for -m ("not gpu": the host suite; "gpu": CUDA and torch).
marker = sys.argv[1] if len(sys.argv) > 1 else "not gpu"
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rs", "-m", marker,
                      os.path.dirname(os.path.abspath(__file__))]))
