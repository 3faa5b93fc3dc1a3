"""Loading libxpack.so and turning its status codes into exceptions.

The binding is ctypes over the C API (doc/python.md says why): nothing is
compiled at install time, and because every option and info struct carries its
own size, this package passes the size of the struct it knows and keeps working
against a newer library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path
from typing import Optional

_LIB_NAMES = ("libxpack.so.0", "libxpack.so")


class XpackError(OSError):
    """A libxpack call failed.

    ``code`` is the library's status (a negated errno, or an ``XPACK_E_*``
    value at or below -1000); ``errno`` is set for the errno kind; the message
    is the library's own (the handle's message, or xpack_last_error()).
    """

    def __init__(self, code: int, message: str, call: str = ""):
        self.code = code
        self.call = call
        reason = strerror(code)
        # The library's messages usually name the reason already ("...: No such
        # file or directory"); appending it again reads as a stutter.
        named = message and reason.split(" (")[0].lower() in message.lower()
        text = message if named else (f"{message} ({reason})" if message else reason)
        if call:
            text = f"{call}: {text}"
        super().__init__(-code if -1000 < code < 0 else None, text)
        # OSError puts errno into str(); keep the library's message as the text.
        self.args = (text,)

    def __str__(self) -> str:
        return self.args[0]


class ChecksumError(XpackError):
    """An expert object's bytes do not match their stored checksum (or its padding is not zero)."""


class ClosedError(ValueError):
    """The handle was closed (or destroyed) before this call."""


def _candidates() -> list:
    out = []
    explicit = os.environ.get("XPACK_LIBRARY")
    if explicit:
        return [explicit]
    build = os.environ.get("XPACK_BUILD_DIR")
    if build:
        for name in _LIB_NAMES:
            out.append(str(Path(build) / name))
        return out
    found = ctypes.util.find_library("xpack")
    if found:
        out.append(found)
    out.extend(_LIB_NAMES)
    for prefix in ("/usr/local/lib/x86_64-linux-gnu", "/usr/local/lib", "/usr/lib/x86_64-linux-gnu"):
        out.append(str(Path(prefix) / "libxpack.so.0"))
    return out


def _load() -> ctypes.CDLL:
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
    where = "; ".join(errors)
    raise ImportError(
        "libxpack.so not found (set XPACK_LIBRARY to the .so file, or XPACK_BUILD_DIR to a meson "
        f"build folder, or install libxpack): {where}")


lib = _load()

c_int, c_uint32, c_uint64, c_size_t = ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_size_t
c_char_p, c_void_p = ctypes.c_char_p, ctypes.c_void_p


def _proto(name: str, restype, *argtypes) -> None:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


_proto("xpack_version", c_char_p)
_proto("xpack_version_number", ctypes.c_uint)
_proto("xpack_strerror", c_char_p, c_int)
_proto("xpack_last_error", c_char_p)
_proto("xpack_type_info", c_int, c_uint32, ctypes.POINTER(c_char_p), ctypes.POINTER(c_uint32),
       ctypes.POINTER(c_uint32))


def strerror(code: int) -> str:
    """The library's static description of a status code."""
    return lib.xpack_strerror(int(code)).decode("utf-8", "replace")


def last_error() -> str:
    """The calling thread's most recent libxpack message ("" if none)."""
    return lib.xpack_last_error().decode("utf-8", "replace")


def check(rc: int, call: str, message: Optional[str] = None, kind=XpackError) -> int:
    """Raise ``kind`` for a negative status; return rc otherwise."""
    if rc < 0:
        raise kind(rc, message if message is not None else last_error(), call)
    return rc


def version() -> str:
    """libxpack's version string, e.g. "0.1.0" (the loaded library's, not this package's)."""
    return lib.xpack_version().decode()


def type_name(ggml_type: int) -> str:
    """ggml's name of a tensor type id ("Q2_K", "MXFP4", ...)."""
    name = c_char_p()
    check(lib.xpack_type_info(ggml_type, ctypes.byref(name), None, None), "xpack_type_info")
    return name.value.decode()


def type_block(ggml_type: int) -> tuple:
    """(elements, bytes) of one block of a ggml type."""
    elems, nbytes = c_uint32(), c_uint32()
    check(lib.xpack_type_info(ggml_type, None, ctypes.byref(elems), ctypes.byref(nbytes)), "xpack_type_info")
    return elems.value, nbytes.value


class Owned:
    """A C handle, destroyed when the last Python object that needs it is gone.

    Python objects built on a handle (a cache on a pack, a slot view on a
    cache) keep its Owned alive, so closing the parent early never frees
    memory a child still points into: close() only ends the parent's own use.
    """

    def __init__(self, ptr: ctypes.c_void_p, destroy, *deps: "Owned"):
        self.ptr = ptr
        self._destroy = destroy
        self._deps = deps

    def __del__(self) -> None:
        if self.ptr:
            self._destroy(self.ptr)
            self.ptr = None


class Handle:
    """The lifetime every Python object over a C handle shares.

    close() ends this object's use (idempotent; later calls raise ClosedError);
    the C handle itself lives in an Owned, freed once nothing needs it.
    Subclasses set ``_kind`` (for messages), ``_h`` and ``_owned``.
    """

    _kind = "handle"
    _h = ctypes.c_void_p()
    _owned: "Optional[Owned]" = None

    def close(self) -> None:
        self._h = ctypes.c_void_p()
        self._owned = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return not self._h

    def _handle(self) -> ctypes.c_void_p:
        if not self._h:
            raise ClosedError(f"the {self._kind} is closed")
        return self._h

    def _owner(self) -> Owned:
        self._handle()
        return self._owned
