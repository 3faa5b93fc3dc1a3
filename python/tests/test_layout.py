"""Every ctypes mirror (xpack/_structs.py) against the C compiler's layout of xpack.h."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess

from conftest import skip_absent
from xpack._structs import MIRRORS


def c_layout() -> dict:
    exe = os.environ.get("XPACK_STRUCT_LAYOUT")
    if not exe or not os.path.exists(exe):
        skip_absent("fixture", "XPACK_STRUCT_LAYOUT (the struct_layout program meson builds) is not set")
    return json.loads(subprocess.run([exe], check=True, capture_output=True, text=True).stdout)


def test_every_mirror_has_the_c_layout():
    c = c_layout()
    assert set(c) == set(MIRRORS), "struct_layout.c and MIRRORS list different structs"
    for name, mirror in MIRRORS.items():
        want = c[name]
        assert ctypes.sizeof(mirror) == want["sizeof"], name
        fields = {f[0] for f in mirror._fields_}
        assert fields == set(want) - {"sizeof"}, f"{name}: fields differ"
        for field in fields:
            assert getattr(mirror, field).offset == want[field], f"{name}.{field}"
