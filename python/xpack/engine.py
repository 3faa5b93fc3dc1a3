"""The I/O engine (xpack_engine_*): io_uring O_DIRECT reads of pack objects into
registered staging slots, without the cache. Single issuer: the first thread
that submits or reaps owns the ring, and every call but counters() and
slot_view() must come from it (the library refuses others)."""

from __future__ import annotations

import ctypes
import operator
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from . import _lib
from ._lib import XpackError, lib
from ._structs import EngineCounters, EngineOptions, ReadCompletion, ReadRequest, sized
from .pack import Pack

_P, _u32, _int, _sz = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_size_t
_proto = _lib._proto
_proto("xpack_engine_options_init", _int, ctypes.POINTER(EngineOptions))
_proto("xpack_engine_create", _int, _P, ctypes.POINTER(EngineOptions), ctypes.POINTER(_P))
_proto("xpack_engine_destroy", None, _P)
_proto("xpack_engine_errmsg", ctypes.c_char_p, _P)
_proto("xpack_engine_submit", _int, _P, ctypes.POINTER(ReadRequest), _sz, _sz)
_proto("xpack_engine_reap", _int, _P, ctypes.POINTER(ReadCompletion), _sz, _sz, _int)
_proto("xpack_engine_slot_data", _int, _P, _u32, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_sz))
_proto("xpack_engine_get_counters", _int, _P, ctypes.POINTER(EngineCounters))


@dataclass(frozen=True)
class Completion:
    """One finished object: ``status`` 0 means the slot holds it; else the failure
    (a negated errno or an xpack.Status) and ``error`` the engine's message."""

    slot: int
    layer: int
    expert: int
    status: int
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 0


class Engine(_lib.Handle):
    """Reads objects of ``pack`` into ``slots`` staging buffers (one object each).

    ``submit([(layer, expert, slot), ...])`` queues reads (all or nothing);
    ``reap(timeout_ms)`` returns the objects that finished, in completion order;
    ``slot_view(slot)`` is a finished slot's bytes in place (valid until the slot
    is submitted again).
    """

    _kind = "engine"

    def __init__(self, pack: Pack, slots: int = 8, *, queue_depth: int = 0, read_splits: int = 0,
                 direct_io: bool = True, sqpoll: bool = False):
        if not isinstance(pack, Pack):
            raise TypeError("pack must be an xpack.Pack")
        if operator.index(slots) < 1:
            raise ValueError("slots must be >= 1")
        self._owned = None
        self._h = _P()
        self.pack = pack
        o = sized(EngineOptions)
        lib.xpack_engine_options_init(ctypes.byref(o))
        o.slots, o.queue_depth, o.read_splits = slots, queue_depth, read_splits
        o.direct_io = 0 if direct_io else -1
        o.sqpoll = 1 if sqpoll else 0
        h = _P()
        _lib.check(lib.xpack_engine_create(pack._handle(), ctypes.byref(o), ctypes.byref(h)), "create engine")
        self._owned = _lib.Owned(h, lib.xpack_engine_destroy, pack._owner())
        self._h = h
        self.slots = slots

    def _message(self) -> str:
        return lib.xpack_engine_errmsg(self._h).decode("utf-8", "replace")

    def submit(self, reads: Iterable[Tuple[int, int, int]]) -> None:
        """Queues (layer, expert, slot) reads. All or nothing: an unknown object, a slot
        out of range or busy, or a slot named twice rejects the batch (XpackError)."""
        h = self._handle()
        reqs = [tuple(operator.index(v) for v in r) for r in reads]
        for r in reqs:
            if len(r) != 3 or min(r) < 0 or max(r) > 0xFFFFFFFF:
                raise ValueError(f"a read is (layer, expert, slot) with non-negative values, not {r!r}")
        arr = (ReadRequest * max(len(reqs), 1))(*[ReadRequest(*r) for r in reqs])
        rc = lib.xpack_engine_submit(h, arr, len(reqs), ctypes.sizeof(ReadRequest))
        if rc < 0:
            raise XpackError(rc, self._message(), "submit")

    def reap(self, timeout_ms: int = -1, max_items: Optional[int] = None) -> List[Completion]:
        """Finished objects, in completion order. timeout_ms 0: never block; < 0: until at
        least one finished (at once when nothing is in flight); > 0: at most that long."""
        h = self._handle()
        n = max_items if max_items is not None else self.slots
        out = (ReadCompletion * max(n, 1))()
        rc = lib.xpack_engine_reap(h, out, n, ctypes.sizeof(ReadCompletion), int(timeout_ms))
        if rc < 0:
            raise XpackError(rc, self._message(), "reap")
        done = []
        for c in out[:rc]:
            err = "" if c.status == 0 else self._message()
            done.append(Completion(c.slot, c.layer_slot, c.expert, c.status, err))
        return done

    def slot_view(self, slot: int) -> np.ndarray:
        """A finished slot's object bytes (read-only numpy view, no copy)."""
        h = self._handle()
        data, nbytes = ctypes.c_void_p(), _sz()
        rc = lib.xpack_engine_slot_data(h, operator.index(slot), ctypes.byref(data), ctypes.byref(nbytes))
        if rc < 0:
            raise XpackError(rc, self._message(), f"slot {slot}")
        buf = (ctypes.c_uint8 * nbytes.value).from_address(data.value)
        buf.owner = self._owned
        arr = np.frombuffer(buf, dtype=np.uint8)
        arr.flags.writeable = False
        return arr

    def counters(self) -> Dict[str, object]:
        """The engine's counters (reads, bytes, latency quantiles, staging page size...)."""
        c = sized(EngineCounters)
        rc = lib.xpack_engine_get_counters(self._handle(), ctypes.byref(c))
        if rc < 0:
            raise XpackError(rc, self._message(), "counters")
        out = {name: getattr(c, name) for name, _ in EngineCounters._fields_ if name != "size"}
        out["lat_log2_ns"] = list(c.lat_log2_ns)
        return out
