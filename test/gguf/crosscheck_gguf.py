#!/usr/bin/env python3
"""Cross-checks libxpack's GGUF reader (through the C API, via ctypes) against an
independent implementation: llama.cpp's gguf-py (the `gguf` package).

For every file: the same metadata keys, value types and values (arrays element by
element), the same tensors (name, type, shape, absolute offset, byte size) and the
same tensor bytes. Files: test/data/stories260K.gguf, xpack-synth outputs, a file
written by gguf-py's own GGUFWriter (all value types, nested arrays), and the
GGUFs in ../shared when present (reported as skipped otherwise).

usage: crosscheck_gguf.py LIBXPACK_SO XPACK_SYNTH TEST_DATA_DIR [SHARED_DIR]
"""
import ctypes
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

try:
    import gguf
except ImportError:  # the CI installs it; say so instead of passing silently
    print("SKIP: python package 'gguf' is not installed")
    sys.exit(1 if os.environ.get("XPACK_REQUIRE_FIXTURES") == "1" else 77)

XPACK_GGUF_SINGLE_FILE = 1
ARRAY = 9
STRING = 8
FLOATS = (6, 12)
SIGNED = (1, 3, 5, 11)


class TensorInfo(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("name", ctypes.c_char_p), ("type", ctypes.c_uint32),
                ("n_dims", ctypes.c_uint32), ("ne", ctypes.c_uint64 * 4),
                ("nbytes", ctypes.c_uint64), ("shard", ctypes.c_uint32),
                ("file_offset", ctypes.c_uint64)]


class Options(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_uint32)]


def load_lib(path):
    lib = ctypes.CDLL(path)
    h = ctypes.c_void_p
    i64 = ctypes.c_int64
    sig = {
        "xpack_gguf_open": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(Options), ctypes.POINTER(h)]),
        "xpack_gguf_close": (None, [h]),
        "xpack_gguf_errmsg": (ctypes.c_char_p, [h]),
        "xpack_last_error": (ctypes.c_char_p, []),
        "xpack_gguf_version": (ctypes.c_uint32, [h]),
        "xpack_gguf_key_count": (i64, [h]),
        "xpack_gguf_key_name": (ctypes.c_char_p, [h, i64]),
        "xpack_gguf_key_type": (ctypes.c_int, [h, i64]),
        "xpack_gguf_get_int": (ctypes.c_int, [h, i64, ctypes.POINTER(i64)]),
        "xpack_gguf_get_float": (ctypes.c_int, [h, i64, ctypes.POINTER(ctypes.c_double)]),
        "xpack_gguf_get_string": (ctypes.c_int, [h, i64, ctypes.POINTER(ctypes.c_void_p),
                                                 ctypes.POINTER(ctypes.c_size_t)]),
        "xpack_gguf_get_array": (ctypes.c_int, [h, i64, ctypes.POINTER(ctypes.c_int),
                                                ctypes.POINTER(ctypes.c_uint64)]),
        "xpack_gguf_get_array_int": (ctypes.c_int, [h, i64, ctypes.c_uint64, ctypes.POINTER(i64)]),
        "xpack_gguf_get_array_float": (ctypes.c_int, [h, i64, ctypes.c_uint64,
                                                      ctypes.POINTER(ctypes.c_double)]),
        "xpack_gguf_get_array_string": (ctypes.c_int, [h, i64, ctypes.c_uint64,
                                                       ctypes.POINTER(ctypes.c_void_p),
                                                       ctypes.POINTER(ctypes.c_size_t)]),
        "xpack_gguf_tensor_count": (i64, [h]),
        "xpack_gguf_find_tensor": (i64, [h, ctypes.c_char_p]),
        "xpack_gguf_tensor_info": (ctypes.c_int, [h, i64, ctypes.POINTER(TensorInfo)]),
        "xpack_gguf_tensor_data": (ctypes.c_int, [h, i64, ctypes.POINTER(ctypes.c_void_p)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


class Checker:
    def __init__(self, lib):
        self.lib = lib
        self.failures = []

    def fail(self, path, msg):
        self.failures.append(f"{os.path.basename(path)}: {msg}")

    def ours_string(self, fn, *args):
        p = ctypes.c_void_p()
        n = ctypes.c_size_t()
        rc = fn(*args, ctypes.byref(p), ctypes.byref(n))
        if rc != 0:
            return None
        return ctypes.string_at(p.value, n.value) if n.value else b""

    def compare_scalar(self, path, key, vtype, theirs, get_int, get_float, get_str, what):
        if vtype == STRING:
            ours = get_str()
            if isinstance(theirs, str):
                theirs = theirs.encode("utf-8", "surrogateescape")
            if ours != bytes(theirs):
                self.fail(path, f"{what}: string {ours!r} != {theirs!r}")
        elif vtype in FLOATS:
            d = ctypes.c_double()
            if get_float(ctypes.byref(d)) != 0:
                self.fail(path, f"{what}: get_float failed")
            elif not (d.value == float(theirs) or (math.isnan(d.value) and math.isnan(float(theirs)))):
                self.fail(path, f"{what}: float {d.value} != {theirs}")
        else:
            v = ctypes.c_int64()
            rc = get_int(ctypes.byref(v))
            expect = int(theirs)
            if rc == -1015 and vtype == 10 and expect > 2**63 - 1:  # u64 beyond int64: LIMIT
                return
            if rc != 0:
                self.fail(path, f"{what}: get_int rc {rc}")
            elif v.value != expect:
                self.fail(path, f"{what}: int {v.value} != {expect}")

    def check_file(self, path):
        lib = self.lib
        handle = ctypes.c_void_p()
        opts = Options(ctypes.sizeof(Options), XPACK_GGUF_SINGLE_FILE)
        rc = lib.xpack_gguf_open(path.encode(), ctypes.byref(opts), ctypes.byref(handle))
        if rc != 0:
            self.fail(path, f"xpack_gguf_open failed {rc}: {lib.xpack_last_error().decode()}")
            return
        try:
            self._check(path, handle)
        finally:
            lib.xpack_gguf_close(handle)

    def _check(self, path, g):
        lib = self.lib
        r = gguf.GGUFReader(path)
        fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
        if lib.xpack_gguf_version(g) != int(r.fields["GGUF.version"].parts[-1][0]):
            self.fail(path, "version differs")
        n_keys = lib.xpack_gguf_key_count(g)
        if n_keys != len(fields):
            self.fail(path, f"key count {n_keys} != {len(fields)}")
        for i in range(n_keys):
            key = lib.xpack_gguf_key_name(g, i).decode()
            f = fields.get(key)
            if f is None:
                self.fail(path, f"key {key} unknown to gguf-py")
                continue
            if list(fields).index(key) != i:
                self.fail(path, f"key {key}: order differs")
            vtype = lib.xpack_gguf_key_type(g, i)
            if vtype != int(f.types[0]):
                self.fail(path, f"key {key}: type {vtype} != {int(f.types[0])}")
                continue
            if vtype != ARRAY:
                theirs = f.contents()
                self.compare_scalar(path, key, vtype, theirs,
                                    lambda out: lib.xpack_gguf_get_int(g, i, out),
                                    lambda out: lib.xpack_gguf_get_float(g, i, out),
                                    lambda: self.ours_string(lib.xpack_gguf_get_string, g, i), key)
                continue
            et = ctypes.c_int()
            n = ctypes.c_uint64()
            lib.xpack_gguf_get_array(g, i, ctypes.byref(et), ctypes.byref(n))
            if len(f.types) > 1 and et.value != int(f.types[1]):
                self.fail(path, f"key {key}: element type {et.value} != {int(f.types[1])}")
                continue
            if et.value == ARRAY:
                # gguf-py flattens nested arrays (f.data indexes the leaves), and the C
                # API does not descend into them: compare the outer count (parts[4]).
                outer = int(f.parts[4][0])
                if n.value != outer:
                    self.fail(path, f"key {key}: {n.value} nested elements != {outer}")
                for j in range(n.value):
                    v = ctypes.c_int64()
                    if lib.xpack_gguf_get_array_int(g, i, j, ctypes.byref(v)) != -1012:
                        self.fail(path, f"key {key}[{j}]: nested element not reported as XPACK_E_TYPE")
                continue
            if n.value != len(f.data):
                self.fail(path, f"key {key}: {n.value} elements != {len(f.data)}")
                continue
            if et.value in FLOATS or et.value == STRING:
                theirs_list = f.contents()
            else:
                theirs_list = [f.parts[idx][0] for idx in f.data]
            for j in range(n.value):
                self.compare_scalar(path, key, et.value, theirs_list[j],
                                    lambda out: lib.xpack_gguf_get_array_int(g, i, j, out),
                                    lambda out: lib.xpack_gguf_get_array_float(g, i, j, out),
                                    lambda: self.ours_string(lib.xpack_gguf_get_array_string, g, i, j),
                                    f"{key}[{j}]")

        n_t = lib.xpack_gguf_tensor_count(g)
        if n_t != len(r.tensors):
            self.fail(path, f"tensor count {n_t} != {len(r.tensors)}")
        for t in r.tensors:
            idx = lib.xpack_gguf_find_tensor(g, t.name.encode())
            if idx < 0:
                self.fail(path, f"tensor {t.name} missing")
                continue
            ti = TensorInfo()
            ti.size = ctypes.sizeof(TensorInfo)
            lib.xpack_gguf_tensor_info(g, idx, ctypes.byref(ti))
            shape = [int(x) for x in t.shape]
            ours_shape = [ti.ne[d] for d in range(ti.n_dims)]
            got = (ti.type, ours_shape, ti.file_offset, ti.nbytes)
            want = (int(t.tensor_type), shape, int(t.data_offset), int(t.n_bytes))
            if got != want:
                self.fail(path, f"tensor {t.name}: (type, ne, offset, nbytes) {got} != {want}")
                continue
            p = ctypes.c_void_p()
            if lib.xpack_gguf_tensor_data(g, idx, ctypes.byref(p)) != 0:
                self.fail(path, f"tensor {t.name}: no data")
                continue
            ours = ctypes.string_at(p.value, ti.nbytes) if ti.nbytes else b""
            if ours != np.ascontiguousarray(t.data).tobytes():
                self.fail(path, f"tensor {t.name}: bytes differ")


def write_with_gguf_py(path):
    """A file from gguf-py's own writer: every value type, nested arrays, tensors."""
    w = gguf.GGUFWriter(path, "xpacktest")
    w.add_uint8("v.u8", 200)
    w.add_int8("v.i8", -100)
    w.add_uint16("v.u16", 60000)
    w.add_int16("v.i16", -30000)
    w.add_uint32("v.u32", 4000000000)
    w.add_int32("v.i32", -2000000000)
    w.add_uint64("v.u64", 2**64 - 1)
    w.add_int64("v.i64", -(2**63))
    w.add_float32("v.f32", 0.1)
    w.add_float64("v.f64", -1e-300)
    w.add_bool("v.bool", True)
    w.add_string("v.str", "héllo wörld")
    w.add_array("v.arr_i32", [1, -2, 3])
    w.add_array("v.arr_f32", [0.5, 1.5])
    w.add_array("v.arr_str", ["a", "", "ccc"])
    w.add_array("v.nested", [[1, 2], [3]])
    rng = np.random.default_rng(5)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((7,)).astype(np.float16))
    raw = rng.integers(0, 255, size=(2, 4 * 34), dtype=np.uint8)
    w.add_tensor("q8", raw, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    lib_path, synth, data_dir = sys.argv[1:4]
    shared = sys.argv[4] if len(sys.argv) > 4 else ""
    checker = Checker(load_lib(lib_path))
    files = [os.path.join(data_dir, "stories260K.gguf")]
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ("deepseek4", "kimi-k3", "mixtral"):
            out = os.path.join(tmp, f"{arch}.gguf")
            subprocess.run([synth, "-q", "--arch", arch, "--layers", "3", "-o", out], check=True)
            files.append(out)
        subprocess.run([synth, "-q", "--arch", "deepseek4", "--fused-gate-up", "--shards", "2",
                        "-o", os.path.join(tmp, "ds.gguf")], check=True)
        files += [os.path.join(tmp, f"ds-0000{k}-of-00002.gguf") for k in (1, 2)]
        pyfile = os.path.join(tmp, "gguf-py.gguf")
        write_with_gguf_py(pyfile)
        files.append(pyfile)
        if shared and os.path.isdir(os.path.join(shared, "oracle")):
            # gguf-py needs ~15 s per large vocab file; one vocab file is enough here
            # (test_gguf_reader.cpp checks all three).
            files.append(os.path.join(shared, "models/vocab/ggml-vocab-llama-spm.gguf"))
            d = os.path.join(shared, "oracle/models")
            files += sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".gguf"))
        else:
            print("SKIPPED: ../shared not present (vocab and oracle GGUFs not cross-checked)")
        for f in files:
            checker.check_file(f)
            print(f"checked {os.path.basename(f)}")
    for msg in checker.failures[:50]:
        print("FAIL:", msg)
    print(f"{len(files)} files, {len(checker.failures)} differences")
    return 1 if checker.failures else 0


if __name__ == "__main__":
    sys.exit(main())
