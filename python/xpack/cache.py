"""The expert cache (xpack_cache_*): a byte-budgeted set of slots on the host or
a CUDA device, filled from a pack by io_uring reads, and zero-copy views of the
slots (the buffer protocol / numpy on the host; DLPack and
``__cuda_array_interface__`` on a GPU, so ``torch.from_dlpack(view)`` is the
slot's memory itself)."""

from __future__ import annotations

import ctypes
import json
import operator
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from . import _dlpack, _lib
from ._lib import ClosedError, XpackError, lib
from ._structs import CacheCounters, CacheInfo, CacheOptions, ExpertSlot, LayerCounters, Status, sized
from .pack import Pack

_P, _u32, _u64, _int, _sz = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int, ctypes.c_size_t
_proto = _lib._proto
_proto("xpack_cache_options_init", _int, ctypes.POINTER(CacheOptions))
_proto("xpack_cache_create", _int, _P, ctypes.POINTER(CacheOptions), ctypes.POINTER(_P))
_proto("xpack_cache_destroy", None, _P)
_proto("xpack_cache_errmsg", ctypes.c_char_p, _P)
_proto("xpack_cache_get_info", _int, _P, ctypes.POINTER(CacheInfo))
_proto("xpack_cache_acquire_ex", _int, _P, _u32, ctypes.POINTER(_u32), _sz, _u32, _u32, ctypes.POINTER(ExpertSlot), _sz,
       ctypes.POINTER(_u64))
_proto("xpack_cache_entry", _int, _P, _u64, _sz, ctypes.POINTER(ExpertSlot), _sz)
_proto("xpack_cache_wait", _int, _P, _u64, _sz)
_proto("xpack_cache_wait_all", _int, _P, _u64)
_proto("xpack_cache_release", _int, _P, _u64, _P)
_proto("xpack_cache_release_expert", _int, _P, _u64, _sz, _P)
_proto("xpack_cache_prefetch", _int, _P, _u32, ctypes.POINTER(_u32), _sz)
_proto("xpack_cache_prefetch_ex", _int, _P, _u32, ctypes.POINTER(_u32), _sz, _u32)
_proto("xpack_cache_get_counters", _int, _P, ctypes.POINTER(CacheCounters))
_proto("xpack_cache_get_layer_counters", _int, _P, _u32, ctypes.POINTER(LayerCounters))
_proto("xpack_cache_write_stats", _int, _P)

SLOT_DEFERRED = 0xFFFFFFFF
ACQUIRE_DEFER = 1
PREFETCH_CERTAIN = 1

_POLICIES = {"adaptive": 0, "lru": 1, "lfu": 2, "hybrid": 3, "decay": 4}
_DEVICES = {"auto": 0, "cuda": 1, "host": 2}


@dataclass(frozen=True)
class CacheInfoView:
    slot_count: int
    n_layers: int
    n_experts: int
    slot_stride: int
    object_bytes: int
    device: str   # "host" or "cuda"
    policy: str
    host_frames: int = 0        # host tier frames (0: none); it holds host_frames - 1 experts
    host_frame_stride: int = 0


class Cache(_lib.Handle):
    """An expert cache over ``pack``.

    ``budget_bytes``: device memory for slots (0: all free memory minus
    ``reserve_bytes``); ``device``: "host", "cuda" or "auto"; ``policy``:
    "adaptive" (the default), "lru", "lfu", "hybrid" or "decay"; ``verify``: check every object's
    xxh3 as it is read (default True); ``direct_io``: O_DIRECT reads (default
    True: a filesystem that refuses them raises XpackError with
    Status.NO_DIRECT_IO); ``stats_path``/``trace_path`` as in the C options;
    ``host_cache_bytes``: pinned host memory for the host tier behind the
    slots (0: none; doc/cache.md, "Host tier").
    Thread-safe like the C cache: several threads may acquire and release.
    """

    _kind = "cache"

    def __init__(self, pack: Pack, budget_bytes: int = 0, *, reserve_bytes: int = 0, device: str = "host",
                 policy: str = "adaptive", cuda_device: int = 0, verify: bool = True, direct_io: bool = True,
                 staging_slots: int = 0, queue_depth: int = 0, stats_path: Optional[str] = None,
                 trace_path: Optional[str] = None, host_device_bytes: int = 0,
                 host_cache_bytes: int = 0):
        if not isinstance(pack, Pack):
            raise TypeError("pack must be an xpack.Pack")
        if device not in _DEVICES:
            raise ValueError(f"device must be one of {', '.join(_DEVICES)}, not {device!r}")
        if policy not in _POLICIES:
            raise ValueError(f"policy must be one of {', '.join(_POLICIES)}, not {policy!r}")
        for name, v in (("budget_bytes", budget_bytes), ("reserve_bytes", reserve_bytes),
                        ("host_device_bytes", host_device_bytes), ("host_cache_bytes", host_cache_bytes)):
            if operator.index(v) < 0:
                raise ValueError(f"{name} must be >= 0")
        self._owned = None
        self._h = _P()
        self.pack = pack
        o = sized(CacheOptions)
        lib.xpack_cache_options_init(ctypes.byref(o))
        o.budget_bytes, o.reserve_bytes = budget_bytes, reserve_bytes
        o.policy, o.device, o.cuda_device = _POLICIES[policy], _DEVICES[device], cuda_device
        o.staging_slots, o.queue_depth = staging_slots, queue_depth
        o.direct_io = 0 if direct_io else -1
        o.verify = 0 if verify else -1
        self._keep = [os.fsencode(p) if p is not None else None for p in (stats_path, trace_path)]
        o.stats_path, o.trace_path = self._keep
        o.host_device_bytes = host_device_bytes
        o.host_cache_bytes = host_cache_bytes
        h = _P()
        rc = lib.xpack_cache_create(pack._handle(), ctypes.byref(o), ctypes.byref(h))
        _lib.check(rc, "create cache")
        self._owned = _lib.Owned(h, lib.xpack_cache_destroy, pack._owner())
        self._h = h
        ci = sized(CacheInfo)
        self._check(lib.xpack_cache_get_info(h, ctypes.byref(ci)), "xpack_cache_get_info")
        self._info = CacheInfoView(ci.slot_count, ci.n_layers, ci.n_experts, ci.slot_stride, ci.object_bytes,
                                   ci.device_backend.decode(), ci.policy.decode(), ci.host_frames,
                                   ci.host_frame_stride)

    def _check(self, rc: int, call: str, h: Optional[ctypes.c_void_p] = None) -> int:
        if rc < 0:
            handle = h if h is not None else self._h
            raise XpackError(rc, lib.xpack_cache_errmsg(handle).decode("utf-8", "replace"), call)
        return rc

    @property
    def info(self) -> CacheInfoView:
        self._handle()
        return self._info

    # -- requests ---------------------------------------------------------
    def acquire(self, layer: int, experts: Sequence[int], n_tokens: int = 1, defer: bool = False) -> "Request":
        """Requests experts of one MoE layer (pack layer row) for ``n_tokens``
        tokens and returns at once; hits are ready, misses load in the
        background. With ``defer``, experts beyond the free slots wait for
        slots released earlier in the same request (stream through them:
        wait(i), use, release_expert(i)). Use the Request as a context manager
        (or call release())."""
        h = self._handle()
        layer = operator.index(layer)
        if not 0 <= layer < self._info.n_layers:
            raise IndexError(f"layer {layer} out of range 0..{self._info.n_layers - 1}")
        ids = [operator.index(e) for e in experts]
        for e in ids:
            if not 0 <= e < self._info.n_experts:
                raise IndexError(f"expert {e} out of range 0..{self._info.n_experts - 1}")
        n_tokens = operator.index(n_tokens)
        if n_tokens < 1:
            raise ValueError("n_tokens must be >= 1")
        arr = (_u32 * max(len(ids), 1))(*ids)
        out = (ExpertSlot * max(len(ids), 1))()
        ticket = _u64()
        rc = lib.xpack_cache_acquire_ex(h, layer, arr, len(ids), n_tokens, ACQUIRE_DEFER if defer else 0, out,
                                        ctypes.sizeof(ExpertSlot), ctypes.byref(ticket))
        self._check(rc, f"acquire layer {layer}")
        return Request(self, layer, ids, ticket.value, out)

    def prefetch(self, layer: int, experts: Sequence[int], certain: bool = False) -> int:
        """Hint: start loading these experts; returns the loads started. A guess (the default)
        takes only free slots or ones the policy values no more. certain=True says they will be
        acquired (xpack_cache_prefetch_ex with XPACK_PREFETCH_CERTAIN): placed as a demand miss
        is and protected until acquired or the next step ends, in at most half the slots."""
        h = self._handle()
        ids = [operator.index(e) for e in experts]
        arr = (_u32 * max(len(ids), 1))(*ids)
        flags = PREFETCH_CERTAIN if certain else 0
        return self._check(lib.xpack_cache_prefetch_ex(h, operator.index(layer), arr, len(ids), flags), "prefetch")

    # -- counters ---------------------------------------------------------
    def counters(self) -> Dict[str, float]:
        """One consistent snapshot of the cache's counters (xpack_cache_counters) as a dict."""
        c = sized(CacheCounters)
        self._check(lib.xpack_cache_get_counters(self._handle(), ctypes.byref(c)), "counters")
        return {name: getattr(c, name) for name, _ in CacheCounters._fields_ if name != "size"}

    def layer_counters(self, layer: int) -> Dict[str, int]:
        """route_calls, route_tokens, hits and misses of one MoE layer."""
        c = sized(LayerCounters)
        self._check(lib.xpack_cache_get_layer_counters(self._handle(), operator.index(layer), ctypes.byref(c)),
                    f"layer counters of layer {layer}")
        return {name: getattr(c, name) for name, _ in LayerCounters._fields_ if name != "size"}

    def write_stats(self) -> None:
        """Writes the stats JSON now (with stats_path) and flushes the routing trace (with trace_path)."""
        self._check(lib.xpack_cache_write_stats(self._handle()), "write_stats")

    def __repr__(self) -> str:
        if self.closed:
            return "<xpack.Cache closed>"
        i = self._info
        return f"<xpack.Cache {i.device} slots={i.slot_count} object_bytes={i.object_bytes} policy={i.policy}>"


@dataclass(frozen=True)
class Entry:
    """One acquired expert, as the cache describes it now."""

    expert: int
    slot: Optional[int]   # None while deferred
    data: int             # device (or host) address of the object; 0 while deferred
    ready_event: int      # cudaEvent_t (0 on the host or while deferred)
    hit: bool
    ready_recorded: bool  # ready_event covers this object's copy: a stream may wait on it (else wait() first)


class Request:
    """The experts of one acquire (a ticket). Release it exactly once: release(),
    or leave a ``with`` block; a Request dropped while held is released then."""

    def __init__(self, cache: Cache, layer: int, experts: List[int], ticket: int, entries):
        self._cache = cache
        self._owned = cache._owned  # the C cache lives while this request may use it
        self._h = cache._h
        self.layer = layer
        self.experts = tuple(experts)
        self.ticket = ticket
        self._held = True
        self._released = [False] * len(experts)
        self._entries = entries

    def __len__(self) -> int:
        return len(self.experts)

    def __enter__(self) -> "Request":
        return self

    def __exit__(self, *exc) -> None:
        if self._held:
            self.release()

    def __del__(self) -> None:
        # A request dropped while held would pin its slots for the cache's life.
        try:
            if self._held and self._owned is not None and self._owned.ptr:
                self._held = False
                lib.xpack_cache_release(self._h, self.ticket, None)
        except Exception:
            pass

    def _index(self, i: int) -> int:
        if not self._held:
            raise ClosedError(f"request {self.ticket} was released")
        i = operator.index(i)
        if not 0 <= i < len(self.experts):
            raise IndexError(f"entry {i} out of range 0..{len(self.experts) - 1}")
        if self._released[i]:
            raise ClosedError(f"entry {i} (expert {self.experts[i]}) was released")
        return i

    def _check(self, rc: int, call: str) -> int:
        return self._cache._check(rc, call, self._h)

    def entry(self, i: int) -> Entry:
        """Entry i's current description (a deferred entry gets its slot once placed)."""
        i = self._index(i)
        e = ExpertSlot()
        self._check(lib.xpack_cache_entry(self._h, self.ticket, i, ctypes.byref(e), ctypes.sizeof(e)), "entry")
        return Entry(e.expert, None if e.slot == SLOT_DEFERRED else e.slot, e.data or 0, e.ready_event or 0,
                     bool(e.hit), bool(e.ready_recorded))

    def hit(self, i: int) -> bool:
        """True if entry i was resident (or already loading) when acquired."""
        return bool(self._entries[self._index(i)].hit)

    def wait(self, i: int) -> Entry:
        """Blocks until entry i's bytes are in its slot (a failed or damaged read raises XpackError)."""
        i = self._index(i)
        self._check(lib.xpack_cache_wait(self._h, self.ticket, i), f"wait for expert {self.experts[i]}")
        return self.entry(i)

    def wait_all(self) -> None:
        if not self._held:
            raise ClosedError(f"request {self.ticket} was released")
        self._check(lib.xpack_cache_wait_all(self._h, self.ticket), "wait_all")

    def view(self, i: int):
        """Entry i's object bytes in place, after waiting for them: a numpy uint8
        array on a host cache, a CudaSlotView (DLPack, __cuda_array_interface__)
        on a CUDA cache. Valid while the entry is held: its slot may take another
        expert after release (the memory itself stays allocated while the view lives)."""
        e = self.wait(i)
        n = self._cache._info.object_bytes
        if self._cache._info.device == "cuda":
            return _dlpack.CudaSlotView(e.data, n, self._cache._info, e.ready_event, self._owned)
        buf = (ctypes.c_uint8 * n).from_address(e.data)
        buf.owner = self._owned  # numpy keeps buf as the array's base, buf keeps the cache
        arr = np.frombuffer(buf, dtype=np.uint8)
        arr.flags.writeable = False
        return arr

    def release_expert(self, i: int, stream: Optional[int] = None) -> None:
        """Ends entry i's protection early (its slot may take a deferred entry).
        ``stream``: the cudaStream_t (an int, e.g. torch's stream.cuda_stream) whose
        work reads the slot; later copies into it wait for that work."""
        i = self._index(i)
        self._check(lib.xpack_cache_release_expert(self._h, self.ticket, i, stream), "release_expert")
        for j, e in enumerate(self.experts):
            if e == self.experts[i]:
                self._released[j] = True

    def release(self, stream: Optional[int] = None) -> None:
        """Ends the request's protection (exactly once; a second call raises ClosedError)."""
        if not self._held:
            raise ClosedError(f"request {self.ticket} was already released")
        self._held = False
        self._check(lib.xpack_cache_release(self._h, self.ticket, stream), "release")
