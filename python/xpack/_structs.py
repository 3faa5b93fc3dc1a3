"""ctypes mirrors of xpack.h's structs and constants.

test_layout.py checks every mirror against the C compiler's sizeof/offsetof of
the real header (a program built with the library), so a field added or moved
in xpack.h without updating this file fails the test suite.
"""

from __future__ import annotations

import ctypes
import enum

c_size_t, c_uint32, c_int32, c_uint64 = ctypes.c_size_t, ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64
c_char_p, c_void_p = ctypes.c_char_p, ctypes.c_void_p


class Status(enum.IntEnum):
    """libxpack's own status codes (negated errno values are the others)."""

    OK = 0
    INVALID_ARG = -1001
    FORMAT = -1002
    TRUNCATED = -1003
    BAD_MAGIC = -1004
    VERSION = -1005
    CHECKSUM = -1006
    SIZE_MISMATCH = -1007
    MISALIGNED = -1008
    IDENTITY = -1009
    UNKNOWN_TYPE = -1010
    NOT_FOUND = -1011
    TYPE = -1012
    OBJECT_CHECKSUM = -1013
    SPLIT = -1014
    LIMIT = -1015
    UNSUPPORTED = -1016
    NO_DIRECT_IO = -1017
    CAPACITY = -1018
    OVERLAP = -1019
    DUPLICATE = -1020
    URING = -1021
    DEVICE = -1022
    INTERNAL = -1099


class GgmlType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    BF16 = 30
    MXFP4 = 39


VALIDATE_STRUCTURE = 0
VALIDATE_CHECKSUMS = 1


class PackOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("trunk_path", c_char_p)]


class PackFault(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("layer", c_uint32), ("expert", c_uint32), ("role", c_int32)]


class PackInfo(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("version", c_uint32),
        ("arch", c_char_p),
        ("n_layers", c_uint32),
        ("n_experts", c_uint32),
        ("n_experts_used", c_uint32),
        ("n_roles", c_uint32),
        ("alignment", c_uint32),
        ("data_start", c_uint64),
        ("object_stride", c_uint64),
        ("object_bytes", c_uint64),
        ("file_size", c_uint64),
        ("source_sha256", ctypes.c_uint8 * 32),
    ]


class RoleInfo(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("name", c_char_p),
        ("type", c_uint32),
        ("n_dims", c_uint32),
        ("ne", c_uint64 * 3),
        ("offset", c_uint64),
        ("nbytes", c_uint64),
    ]


class CacheOptions(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("budget_bytes", c_uint64),
        ("reserve_bytes", c_uint64),
        ("policy", c_int32),
        ("device", c_int32),
        ("cuda_device", c_int32),
        ("staging_slots", c_uint32),
        ("read_splits", c_uint32),
        ("queue_depth", c_uint32),
        ("direct_io", c_int32),
        ("verify", c_int32),
        ("stats_path", c_char_p),
        ("stats_interval", c_uint64),
        ("trace_path", c_char_p),
        ("host_device_bytes", c_uint64),
        ("host_cache_bytes", c_uint64),
    ]


class CacheInfo(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("slot_count", c_uint32),
        ("n_layers", c_uint32),
        ("n_experts", c_uint32),
        ("slot_stride", c_uint64),
        ("object_bytes", c_uint64),
        ("device_backend", c_char_p),
        ("policy", c_char_p),
        ("host_frames", c_uint32),
        ("host_frame_stride", c_uint64),
    ]


class ExpertSlot(ctypes.Structure):
    _fields_ = [
        ("expert", c_uint32),
        ("slot", c_uint32),
        ("data", c_void_p),
        ("ready_event", c_void_p),
        ("hit", c_int32),
        ("ready_recorded", c_int32),
    ]


class CacheCounters(ctypes.Structure):
    _fields_ = [("size", c_size_t)] + [(n, c_uint64) for n in (
        "cache_hits", "cache_misses", "cache_evictions", "pack_reads", "pack_read_bytes", "h2d_bytes",
        "fallback_count", "io_errors", "prefetch_issued", "prefetch_used", "prefetch_wasted", "acquires", "steps",
        "stall_ns", "stall_waits", "read_p50_ns", "read_p99_ns", "h2d_p50_ns", "h2d_p99_ns")] + [
        ("n_layers", c_uint32),
        ("trace_write_errors", c_uint64),
        ("staging_page_bytes", c_uint64),
        ("staging_huge_fraction", ctypes.c_double),
        ("host_hits", c_uint64),
        ("host_demotions", c_uint64),
        ("host_evictions", c_uint64),
        ("d2h_bytes", c_uint64),
        ("ssd_busy_ns", c_uint64),
    ]


class LayerCounters(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("route_calls", c_uint64), ("route_tokens", c_uint64), ("hits", c_uint64),
                ("misses", c_uint64)]


class EngineOptions(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("slots", c_uint32), ("queue_depth", c_uint32), ("read_splits", c_uint32),
                ("sqpoll", c_int32), ("direct_io", c_int32), ("numa_node", c_int32), ("numa_bind", c_int32)]


class ReadRequest(ctypes.Structure):
    _fields_ = [("layer_slot", c_uint32), ("expert", c_uint32), ("slot", c_uint32)]


class ReadCompletion(ctypes.Structure):
    _fields_ = [("slot", c_uint32), ("layer_slot", c_uint32), ("expert", c_uint32), ("status", c_int32)]


class EngineCounters(ctypes.Structure):
    _fields_ = [("size", c_size_t)] + [(n, c_uint64) for n in (
        "reads", "read_bytes", "objects_completed", "io_errors", "fallback_count", "short_read_retries",
        "transient_retries", "lat_p50_ns", "lat_p99_ns", "lat_p999_ns")] + [
        ("lat_log2_ns", c_uint64 * 64),
        ("ring_flags", c_uint32),
        ("staging_page_bytes", c_uint64),
        ("staging_huge_fraction", ctypes.c_double),
    ]


def sized(struct_type):
    """A zero-filled instance whose size field is set, as the C API asks."""
    s = struct_type()
    s.size = ctypes.sizeof(struct_type)
    return s


# Every mirrored struct, by its C name (test_layout.py walks this).
MIRRORS = {
    "xpack_pack_options": PackOptions,
    "xpack_pack_fault": PackFault,
    "xpack_pack_info": PackInfo,
    "xpack_role_info": RoleInfo,
    "xpack_cache_options": CacheOptions,
    "xpack_cache_info": CacheInfo,
    "xpack_expert_slot": ExpertSlot,
    "xpack_cache_counters": CacheCounters,
    "xpack_layer_counters": LayerCounters,
    "xpack_engine_options": EngineOptions,
    "xpack_read_request": ReadRequest,
    "xpack_read_completion": ReadCompletion,
    "xpack_engine_counters": EngineCounters,
}
