"""Zero-copy views of CUDA cache slots: DLPack and ``__cuda_array_interface__``.

A view is the slot's own device memory, nothing copied: ``torch.from_dlpack(v)``
(or ``torch.as_tensor(v, device="cuda")``, ``cupy.asarray(v)``) is a uint8
tensor over the expert object. DLPack is written here with ctypes (the
DLManagedTensor of dlpack.h, version 0.8 ABI) so that no compiled module is
needed. The consumer's stream is made to wait for the slot's ready event
(cudaStreamWaitEvent through the CUDA runtime the library links), so the
bytes are ready for work enqueued there without blocking the host.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Optional, Tuple

_K_DL_CPU, _K_DL_CUDA = 1, 2
_K_DL_UINT = 1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

# What each exported tensor keeps alive until its consumer calls the deleter
# (or the capsule dies unconsumed): the struct, its shape, the cache.
_live = {}


@_Deleter
def _delete(managed) -> None:
    _live.pop(ctypes.addressof(managed.contents), None)


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_CapsuleDestructor
def _capsule_destructor(capsule) -> None:
    # A consumer renames the capsule "used_dltensor" and owns the tensor; an
    # unconsumed one still says "dltensor" and is ours to delete.
    if _capsule_valid(capsule, b"dltensor"):
        ptr = _capsule_ptr(capsule, b"dltensor")
        _live.pop(ptr, None)


def _cudart() -> Optional[ctypes.CDLL]:
    # libxpack.so (a CUDA build) already loaded the runtime; its soname finds
    # that same copy.
    for name in ("libcudart.so.13", "libcudart.so.12", ctypes.util.find_library("cudart"), "libcudart.so"):
        if not name:
            continue
        try:
            rt = ctypes.CDLL(name)
        except OSError:
            continue
        rt.cudaStreamWaitEvent.restype = ctypes.c_int
        rt.cudaStreamWaitEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
        rt.cudaEventSynchronize.restype = ctypes.c_int
        rt.cudaEventSynchronize.argtypes = [ctypes.c_void_p]
        return rt
    return None


_rt = None


def cudart() -> ctypes.CDLL:
    global _rt
    if _rt is None:
        _rt = _cudart()
        if _rt is None:
            raise RuntimeError("the CUDA runtime (libcudart) cannot be loaded")
    return _rt


class CudaSlotView:
    """A cache slot's expert object in device memory (uint8, object_bytes long).

    Valid while its entry is held: the slot takes another expert after the
    release (the memory stays allocated while this view or a tensor made from
    it lives, so a stale view reads the wrong expert but never freed memory).
    """

    def __init__(self, ptr: int, nbytes: int, info, ready_event: int, owner):
        self.ptr, self.nbytes, self.ready_event = ptr, nbytes, ready_event
        self._device_id = 0
        self._owner = owner

    def wait_on(self, stream: int) -> None:
        """Work enqueued on ``stream`` (a cudaStream_t as int; 0 = legacy default) from now on
        waits for the slot's bytes; the host does not block."""
        if self.ready_event:
            rc = cudart().cudaStreamWaitEvent(ctypes.c_void_p(stream or None), ctypes.c_void_p(self.ready_event), 0)
            if rc != 0:
                raise RuntimeError(f"cudaStreamWaitEvent failed ({rc})")

    @property
    def __cuda_array_interface__(self) -> dict:
        # "stream": None, because the bytes are ready once the request's wait
        # returned (Request.view waits); wait_on() orders a stream instead. The
        # read-only flag stays False because torch refuses True; slots must
        # still not be written (the next acquire of the expert would see it).
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": None}

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (_K_DL_CUDA, self._device_id)

    def __dlpack__(self, stream: Optional[int] = None, **_kwargs):
        if stream is not None and stream != -1:
            # DLPack passes CUDA's own handles: 1 is cudaStreamLegacy, 2 cudaStreamPerThread.
            self.wait_on(stream)
        managed = _DLManagedTensor()
        shape = (ctypes.c_int64 * 1)(self.nbytes)
        t = managed.dl_tensor
        t.data = self.ptr
        t.device = _DLDevice(_K_DL_CUDA, self._device_id)
        t.ndim = 1
        t.dtype = _DLDataType(_K_DL_UINT, 8, 1)
        t.shape = shape
        t.strides = None
        t.byte_offset = 0
        managed.deleter = _delete
        addr = ctypes.addressof(managed)
        _live[addr] = (managed, shape, self._owner)
        return _capsule_new(addr, b"dltensor", ctypes.cast(_capsule_destructor, ctypes.c_void_p))

    def __repr__(self) -> str:
        return f"<xpack.CudaSlotView 0x{self.ptr:x} {self.nbytes} bytes>"
