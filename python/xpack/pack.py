"""Expert Packs: open, validate, describe and read objects (xpack_pack_*)."""

from __future__ import annotations

import ctypes
import operator
import os
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from . import _lib
from ._lib import ChecksumError, XpackError, check, lib
from ._structs import VALIDATE_CHECKSUMS, VALIDATE_STRUCTURE, PackFault, PackInfo, PackOptions, RoleInfo, Status, sized

_P = ctypes.c_void_p
_u32, _u64, _int = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
_proto = _lib._proto
_proto("xpack_pack_open", _int, ctypes.c_char_p, ctypes.POINTER(PackOptions), ctypes.POINTER(_P))
_proto("xpack_pack_close", None, _P)
_proto("xpack_pack_errmsg", ctypes.c_char_p, _P)
_proto("xpack_pack_validate", _int, _P, _int, ctypes.POINTER(PackFault))
_proto("xpack_pack_get_info", _int, _P, ctypes.POINTER(PackInfo))
_proto("xpack_pack_path", ctypes.c_char_p, _P)
_proto("xpack_pack_layer_block", _int, _P, _u32, ctypes.POINTER(_u32))
_proto("xpack_pack_layer_slot", _int, _P, _u32, ctypes.POINTER(_u32))
_proto("xpack_pack_role_info", _int, _P, _u32, ctypes.POINTER(RoleInfo))
_proto("xpack_pack_find_role", _int, _P, ctypes.c_char_p)
_proto("xpack_pack_role_source", _int, _P, _u32, _u32, ctypes.c_char_p, ctypes.c_size_t)
_proto("xpack_pack_object_offset", _int, _P, _u32, _u32, ctypes.POINTER(_u64))
_proto("xpack_pack_object_checksum", _int, _P, _u32, _u32, ctypes.POINTER(_u64))
_proto("xpack_pack_read_object", _int, _P, _u32, _u32, ctypes.c_void_p, ctypes.c_size_t, _int)


@dataclass(frozen=True)
class Role:
    """One tensor role inside every object of the pack (e.g. "gate", "up", "down")."""

    index: int
    name: str
    type: int           # ggml type id (xpack.GgmlType)
    type_name: str      # "MXFP4", "Q2_K", ...
    shape: Tuple[int, ...]  # ggml order: shape[0] is the contiguous (input) dimension
    offset: int         # byte offset inside an object
    nbytes: int


@dataclass(frozen=True)
class PackInfoView:
    """What a pack holds (xpack_pack_info), as plain Python values."""

    path: str
    version: int
    arch: str
    n_layers: int        # MoE layers (rows of the object table)
    n_experts: int       # routed experts per layer
    n_experts_used: int  # top-k (0 when the source did not say)
    alignment: int
    data_start: int
    object_stride: int
    object_bytes: int
    file_size: int
    source_sha256: bytes
    roles: Tuple[Role, ...]
    layer_blocks: Tuple[int, ...]  # GGUF block index of each MoE layer


class Pack(_lib.Handle):
    """An open Expert Pack (``xpack_pack``).

    ``Pack(path, trunk=None)`` opens and checks the pack (magic, version,
    header checksum, sizes, alignment); with ``trunk`` the pack must have been
    built from that GGUF (else XpackError with code Status.IDENTITY). Use it as a
    context manager or call close(). Reads are thread-safe, like the C calls.

    Layers are the pack's MoE layer rows (0 .. n_layers-1); ``block_of`` and
    ``layer_of`` convert to and from GGUF block indices.
    """

    _kind = "pack"

    def __init__(self, path: "os.PathLike[str] | str", trunk: "Optional[os.PathLike[str] | str]" = None):
        self._owned = None
        self._h = _P()
        opts = sized(PackOptions)
        trunk_b = os.fsencode(trunk) if trunk is not None else None
        opts.trunk_path = trunk_b
        h = _P()
        rc = lib.xpack_pack_open(os.fsencode(path), ctypes.byref(opts), ctypes.byref(h))
        check(rc, f"open {os.fspath(path)}")
        self._owned = _lib.Owned(h, lib.xpack_pack_close)
        self._h = h
        self._info = self._read_info()

    def _check(self, rc: int, call: str, kind=XpackError) -> int:
        if rc < 0:
            msg = lib.xpack_pack_errmsg(self._h).decode("utf-8", "replace")
            raise kind(rc, msg, call)
        return rc

    # -- description ------------------------------------------------------
    def _read_info(self) -> PackInfoView:
        h = self._handle()
        pi = sized(PackInfo)
        self._check(lib.xpack_pack_get_info(h, ctypes.byref(pi)), "xpack_pack_get_info")
        roles = []
        for r in range(pi.n_roles):
            ri = sized(RoleInfo)
            self._check(lib.xpack_pack_role_info(h, r, ctypes.byref(ri)), "xpack_pack_role_info")
            roles.append(Role(r, ri.name.decode(), ri.type, _lib.type_name(ri.type),
                              tuple(int(ri.ne[d]) for d in range(ri.n_dims)), ri.offset, ri.nbytes))
        blocks = []
        for layer in range(pi.n_layers):
            b = _u32()
            self._check(lib.xpack_pack_layer_block(h, layer, ctypes.byref(b)), "xpack_pack_layer_block")
            blocks.append(b.value)
        return PackInfoView(
            path=lib.xpack_pack_path(h).decode("utf-8", "surrogateescape"), version=pi.version,
            arch=(pi.arch or b"").decode(), n_layers=pi.n_layers, n_experts=pi.n_experts,
            n_experts_used=pi.n_experts_used, alignment=pi.alignment, data_start=pi.data_start,
            object_stride=pi.object_stride, object_bytes=pi.object_bytes, file_size=pi.file_size,
            source_sha256=bytes(pi.source_sha256), roles=tuple(roles), layer_blocks=tuple(blocks))

    @property
    def info(self) -> PackInfoView:
        self._handle()
        return self._info

    def role(self, name: str) -> Role:
        """The role called ``name``; KeyError when the pack has none."""
        for r in self.info.roles:
            if r.name == name:
                return r
        raise KeyError(f"the pack has no role {name!r} (roles: {', '.join(r.name for r in self.info.roles)})")

    def block_of(self, layer: int) -> int:
        """GGUF block index of MoE layer row ``layer``."""
        return self._info.layer_blocks[self._check_layer(layer)]

    def layer_of(self, block: int) -> int:
        """MoE layer row of GGUF block ``block``; KeyError for a dense (or absent) block."""
        out = _u32()
        rc = lib.xpack_pack_layer_slot(self._handle(), _check_u32(block, "block"), ctypes.byref(out))
        if rc == Status.NOT_FOUND:
            raise KeyError(f"GGUF block {block} has no routed experts in this pack")
        self._check(rc, "xpack_pack_layer_slot")
        return out.value

    def role_source(self, role: int, block: int) -> str:
        """The source tensor name of a role in a GGUF block (e.g. "blk.3.ffn_up_exps.weight")."""
        buf = ctypes.create_string_buffer(256)
        self._check(lib.xpack_pack_role_source(self._handle(), _check_u32(role, "role"), _check_u32(block, "block"),
                                               buf, len(buf)), "xpack_pack_role_source")
        return buf.value.decode()

    def object_offset(self, layer: int, expert: int) -> int:
        """Absolute file offset of object (layer, expert)."""
        out = _u64()
        self._check(lib.xpack_pack_object_offset(self._handle(), *self._le(layer, expert), ctypes.byref(out)),
                    "xpack_pack_object_offset")
        return out.value

    def object_checksum(self, layer: int, expert: int) -> int:
        """The stored xxh3-64 of object (layer, expert)'s payload."""
        out = _u64()
        self._check(lib.xpack_pack_object_checksum(self._handle(), *self._le(layer, expert), ctypes.byref(out)),
                    "xpack_pack_object_checksum")
        return out.value

    # -- reading ----------------------------------------------------------
    def read_object(self, layer: int, expert: int, out: Optional[np.ndarray] = None, verify: bool = True) -> np.ndarray:
        """Reads object (layer, expert)'s payload (object_bytes) into a uint8 array.

        ``out``: a writable C-contiguous uint8 array of at least object_bytes
        (else a new one is made). With ``verify`` (the default) the checksum is
        checked and a damaged object raises ChecksumError. Thread-safe.
        """
        n = self.info.object_bytes
        if out is None:
            out = np.empty(n, dtype=np.uint8)
        elif out.dtype != np.uint8 or not out.flags.c_contiguous or not out.flags.writeable or out.nbytes < n:
            raise ValueError(f"out must be a writable C-contiguous uint8 array of at least {n} bytes")
        rc = lib.xpack_pack_read_object(self._handle(), *self._le(layer, expert), out.ctypes.data_as(ctypes.c_void_p),
                                        out.nbytes, 1 if verify else 0)
        self._check(rc, f"read object (layer {layer}, expert {expert})",
                    ChecksumError if rc == Status.OBJECT_CHECKSUM else XpackError)
        return out[:n]

    def role_view(self, obj: np.ndarray, role: "str | Role") -> np.ndarray:
        """The bytes of one role inside an object read by read_object (a view, no copy)."""
        r = role if isinstance(role, Role) else self.role(role)
        return obj[r.offset:r.offset + r.nbytes]

    def validate(self, checksums: bool = True) -> None:
        """Checks the pack again; with ``checksums`` reads every object and checks its xxh3
        and zero padding. Raises ChecksumError naming (block, expert, role) on the first damage."""
        fault = sized(PackFault)
        level = VALIDATE_CHECKSUMS if checksums else VALIDATE_STRUCTURE
        rc = lib.xpack_pack_validate(self._handle(), level, ctypes.byref(fault))
        if rc == Status.OBJECT_CHECKSUM:
            err = ChecksumError(rc, lib.xpack_pack_errmsg(self._h).decode("utf-8", "replace"), "validate")
            err.block, err.expert = fault.layer, fault.expert
            err.role = None if fault.role < 0 else self._info.roles[fault.role].name
            raise err
        self._check(rc, "validate")

    # -- helpers ----------------------------------------------------------
    def _check_layer(self, layer: int) -> int:
        layer = operator.index(layer)
        if not 0 <= layer < self.info.n_layers:
            raise IndexError(f"layer {layer} out of range 0..{self.info.n_layers - 1}")
        return layer

    def _le(self, layer: int, expert: int) -> Tuple[int, int]:
        layer = self._check_layer(layer)
        expert = operator.index(expert)
        if not 0 <= expert < self._info.n_experts:
            raise IndexError(f"expert {expert} out of range 0..{self._info.n_experts - 1}")
        return layer, expert

    def __repr__(self) -> str:
        if self.closed:
            return "<xpack.Pack closed>"
        i = self._info
        return (f"<xpack.Pack {i.path!r} {i.arch} layers={i.n_layers} experts={i.n_experts} "
                f"top_k={i.n_experts_used} object_bytes={i.object_bytes}>")


def _check_u32(v: int, what: str) -> int:
    v = operator.index(v)
    if not 0 <= v <= 0xFFFFFFFF:
        raise IndexError(f"{what} {v!r} out of range")
    return v
