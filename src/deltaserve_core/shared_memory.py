"""Shared-memory primitives of the training wing: arrays and flags every DeltaServe process maps by name.

:class:`SharedArray` is a CPU tensor backed by a file in ``/dev/shm`` (``DELTASERVE_SHM_DIR`` overrides, see
:func:`shm_dir`) that any pickler can carry between processes; :class:`SharedFlag` is a boolean on top of one.
The activation buffer (:mod:`deltaserve_core.activation_buffer`) keeps its slot table, tokens and CPU activations in
them, and the backward process (:mod:`deltaserve_core.backward_process`) its GPU grant and control words.
:func:`pin_host_memory` / :func:`unpin_host_memory` page-lock such memory with CUDA (best effort) so device-to-host
copies into it can be asynchronous.
"""

from __future__ import annotations

import os
import time
import uuid
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "SharedArray",
    "SharedFlag",
    "SharedMemoryError",
    "pin_host_memory",
    "shm_dir",
    "unpin_host_memory",
]

_SHM_DIR = os.environ.get("DELTASERVE_SHM_DIR", "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")


class SharedMemoryError(RuntimeError):
    """A shared object was opened (unpickled) after the process that created it freed it."""


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class SharedArray:
    """A CPU tensor mapped from a file in ``/dev/shm``, picklable by *name* with any pickler.

    Created by whoever owns the resource (the buffer, the backward-process controller); unpickling in another
    process maps the same pages. ``torch.from_file(shared=True)`` is used rather than ``share_memory_()``
    because the latter's handles only survive ``torch.multiprocessing``'s pickler, not plain ``pickle``.
    The owner unlinks the file on :meth:`close` or garbage collection; processes that already mapped it keep
    their mapping (POSIX semantics), later unpicklers fail with a clear error.
    """

    def __init__(self, shape: Sequence[int], dtype: torch.dtype, *, fill: float | int | None = 0,
                 directory: str | None = None, _path: str | None = None) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        numel = max(1, int(np.prod(self.shape)))
        self.owner = _path is None
        if _path is None:
            d = directory or _SHM_DIR
            _path = os.path.join(d, f"deltaserve-{os.getpid()}-{uuid.uuid4().hex[:12]}.bin")
        elif not os.path.exists(_path):
            raise SharedMemoryError(
                f"shared array {_path} no longer exists: the process that created it closed it or exited; "
                "unpickle DeltaServe shared objects only while their creator is alive"
            )
        self.path = _path
        flat = torch.from_file(_path, shared=True, size=numel, dtype=dtype)
        self.tensor = flat[: int(np.prod(self.shape))].view(self.shape) if self.shape else flat[:1].view(())
        if self.owner:
            if fill is not None:
                self.tensor.fill_(fill)
            self._finalizer = weakref.finalize(self, _unlink_quietly, _path)

    def numpy(self) -> np.ndarray:
        """A numpy view of the same pages (used on hot paths: numpy scalar access is far cheaper than torch's)."""
        return self.tensor.numpy()

    def close(self) -> None:
        if self.owner:
            self._finalizer()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_open_shared_array, (self.path, self.shape, self.dtype))


def _open_shared_array(path: str, shape: tuple[int, ...], dtype: torch.dtype) -> SharedArray:
    return SharedArray(shape, dtype, _path=path)


class SharedFlag:
    """A boolean visible to every process that holds (a pickled copy of) it; used for the GPU grant.

    ``set``/``clear`` are single stores to shared memory, ``is_set`` a single load: cheap enough to check at
    every layer boundary. :meth:`wait` polls (sleeping ``poll_s`` between looks) because a futex-style wait would
    need a lock that plain pickle cannot carry.
    """

    def __init__(self, initial: bool = True) -> None:
        self._arr = SharedArray((1,), torch.int32, fill=int(initial))
        self._np = self._arr.numpy()

    def set(self) -> None:
        self._np[0] = 1

    def clear(self) -> None:
        self._np[0] = 0

    def is_set(self) -> bool:
        return bool(self._np[0])

    def wait(self, timeout: float | None = None, poll_s: float = 0.001) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._np[0]:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def close(self) -> None:
        self._arr.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"arr": self._arr}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._arr = state["arr"]
        self._np = self._arr.numpy()


# Page-locked ranges this process registered with CUDA: {start address: size}. A registration outlives the
# mapping it was made for unless undone, and a later mapping at the same addresses then fails to register with
# "already mapped" (and leaves CUDA's last-error set, which the next kernel launch reports as its own failure).
_PINNED: dict[int, int] = {}


def _clear_cuda_last_error() -> None:
    """Reset CUDA's per-thread last error after a failed runtime call torch does not check itself."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart" in line}
        for path in paths:
            ctypes.CDLL(path).cudaGetLastError()
    except Exception:  # pragma: no cover - non-Linux or unusual runtime layout
        pass


def unpin_host_memory(ptr: int) -> None:
    if _PINNED.pop(ptr, None) is not None:
        try:
            if int(torch.cuda.cudart().cudaHostUnregister(ptr)) != 0:
                _clear_cuda_last_error()
        except Exception:  # pragma: no cover
            pass


def pin_host_memory(t: torch.Tensor) -> bool:
    """Page-lock shared host memory so device→host copies can be asynchronous; best effort.

    Pageable memory still works (copies become synchronous), so every failure here degrades, never raises.
    """
    if not torch.cuda.is_available():
        return False
    ptr, size = t.data_ptr(), t.numel() * t.element_size()
    for old, old_size in list(_PINNED.items()):
        if old < ptr + size and ptr < old + old_size:  # stale registration of a mapping that is gone
            unpin_host_memory(old)
    try:
        rc = int(torch.cuda.cudart().cudaHostRegister(ptr, size, 0))
    except Exception:  # pragma: no cover - depends on the driver
        return False
    if rc != 0:
        _clear_cuda_last_error()
        return False
    _PINNED[ptr] = size
    return True


def shm_dir() -> Path:
    """Directory where DeltaServe's shared arrays live (``DELTASERVE_SHM_DIR`` overrides)."""
    return Path(_SHM_DIR)
