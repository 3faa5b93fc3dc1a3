"""libxpack from Python: Expert Packs, the io_uring expert reader and the expert cache.

A ctypes binding of libxpack.so (doc/python.md). The library is found installed,
at $XPACK_LIBRARY (the .so file) or in $XPACK_BUILD_DIR (a meson build folder).
"""

from ._lib import ChecksumError, ClosedError, XpackError, last_error, strerror, type_block, type_name, version
from ._structs import GgmlType, Status
from .pack import Pack, PackInfoView, Role
from .cache import Cache, CacheInfoView, Entry, Request
from .engine import Completion, Engine
from ._dlpack import CudaSlotView

__version__ = "0.1.0"

__all__ = [
    "Cache", "CacheInfoView", "Completion", "Engine", "CudaSlotView", "Entry", "Request", "ChecksumError", "ClosedError", "XpackError", "GgmlType", "Status", "Pack", "PackInfoView", "Role",
    "last_error", "strerror", "type_block", "type_name", "version", "__version__",
]
