"""The activation buffer: where a host's forward pass leaves the layer inputs the backward process trains on.

Three processes touch one buffer, each through its own (unpickled) copy of this object:

* the **controller** (the core's scheduler, in the host's scheduling process) calls :meth:`reserve` when it admits
  a sample, reads :attr:`free_tokens` before admitting, and arms :meth:`request_abort` when a client request
  arrives during a fine-tuning-only step;
* the **forward side** (the host's model-runner process; often the same process as the controller) feeds it
  through the :class:`~deltaserve_core.hooks.ActivationSink` protocol: ``begin_step`` → ``layer_input`` per
  (layer, sample) → ``should_abort`` at layer boundaries of fine-tuning-only steps → ``end_step``;
* the **backward process** reads :meth:`captured` views of complete samples, trains on them and
  :meth:`release`\\ s them.

Nothing is copied between them: all state lives in shared memory. Token/label/slot metadata and the small control
block are always CPU arrays backed by files in ``/dev/shm`` (so a plain ``pickle`` round trip re-maps them; this
matters because some hosts ship sinks to their workers with ``pickle``/``cloudpickle`` rather than through
``torch.multiprocessing``). The activations themselves are ``[num_layers, capacity_tokens, hidden]``: in ``/dev/shm``
on CPU, or a CUDA tensor shared through CUDA IPC (the pickled form carries the IPC handle; the creating process
must outlive every user), or in host shared memory with ``offload_to_host=True`` when GPU memory is short (each
layer input is copied device→host as it is captured and streamed back by the backward process layer by layer).

Slot life cycle (``state`` column of the slot table; each transition has exactly one writing process, which is
what makes the table safe without a cross-process lock)::

    FREE --reserve (controller)--> RESERVED --begin_step (forward)--> CAPTURING
    CAPTURING --end_step completed (forward)--> READY --release (backward or controller)--> FREE
    CAPTURING/RESERVED --end_step aborted (forward)--> FREE        (captures discarded, sample goes back to the pool)

How the buffer knows a step is fine-tuning-only: it cannot tell from ``begin_step`` (it never sees inference
rows), so the controller, which built the step, says so with :meth:`mark_finetune_only` when it issues a step
that carries no inference rows. :meth:`request_abort` then stops every marked step still running;
:meth:`should_abort` is ``False`` for any unmarked (mixed) step, so an abort can never cut an inference
request's forward short.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .types import FineTuneSample

__all__ = [
    "ActivationBuffer",
    "ActivationBufferError",
    "CapturedSample",
    "Slot",
    "SlotState",
    "SharedArray",
    "SharedFlag",
    "ForwardAborted",
    "capture_forward",
]

_SHM_DIR = os.environ.get("DELTASERVE_SHM_DIR", "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")


class ActivationBufferError(RuntimeError):
    """Misuse of the buffer by a host or the controller (unknown sample, layer out of order, double reserve)."""


# --------------------------------------------------------------------------------------------- shared memory


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
            raise ActivationBufferError(
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


# --------------------------------------------------------------------------------------------- slot records


class SlotState:
    """Values of the slot table's ``state`` column (ints, because the table is a shared int64 array)."""

    FREE = 0
    RESERVED = 1
    CAPTURING = 2
    READY = 3

    NAMES = {FREE: "free", RESERVED: "reserved", CAPTURING: "capturing", READY: "ready"}


# slot-table columns
_SID, _OFF, _LEN, _STATE, _DONE, _COLS = 0, 1, 2, 3, 4, 5
# control block: [abort, generation, ft-only step ring...]
_ABORT, _GEN, _RING0, _RING_LEN = 0, 1, 2, 8
_NO_STEP = -1


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one admitted sample lives in the buffer: tokens ``[offset, offset + num_tokens)``."""

    index: int
    sample_id: int
    offset: int
    num_tokens: int
    state: int

    @property
    def state_name(self) -> str:
        return SlotState.NAMES.get(self.state, str(self.state))


@dataclass(frozen=True, slots=True)
class CapturedSample:
    """A fully captured sample as the backward reads it; every tensor is a view into shared memory.

    ``hidden[l]`` is the input of decoder layer ``l`` (``[num_tokens, hidden]``); ``input_ids``/``loss_mask``
    follow :class:`~deltaserve_core.types.FineTuneSample` (``loss_mask[i]``: token ``i`` is a target).
    """

    sample_id: int
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    hidden: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_targets(self) -> int:
        return int(self.loss_mask[1:].sum())


# process-local registry so a CUDA buffer unpickled in its creating process reuses the live tensor
# (CUDA IPC handles cannot be opened by the process that exported them)
_LIVE_CUDA: "weakref.WeakValueDictionary[str, torch.Tensor]" = weakref.WeakValueDictionary()


class ActivationBuffer:
    """Preallocated, shared storage for the layer inputs of admitted fine-tuning samples; an ``ActivationSink``.

    Args:
        num_layers, hidden_size: of the served model (``ModelSpec``).
        capacity_tokens: ``S_max`` of Algorithm 1: how many fine-tuning tokens can be held at once. Memory is
            ``num_layers * capacity_tokens * hidden_size * dtype.itemsize`` (0.25 MB/token for an 8B fp16 model).
        dtype: dtype the activations are stored in; the host's activation dtype (a different dtype is converted
            on copy, which breaks bit-exactness with a plain training loop).
        device: where the activations live ("cpu" or a CUDA device).
        max_samples: rows of the slot table (how many samples may be held at once); default
            ``min(capacity_tokens // 2, 1024)``. :meth:`reserve` returns ``None`` when all rows are taken.
        offload_to_host: with a CUDA ``device``, keep the activations in (pinned where possible) shared host memory
            instead of GPU memory; captures are copied device→host as they arrive.

    Created by the controller; handed to the host's forward process and to the backward process by pickling
    (any pickler). Only the creating object frees the shared memory (:meth:`close`).
    """

    def __init__(self, num_layers: int, hidden_size: int, capacity_tokens: int, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", *, max_samples: int | None = None,
                 offload_to_host: bool = False) -> None:
        if num_layers <= 0 or hidden_size <= 0 or capacity_tokens <= 0:
            raise ValueError(
                f"ActivationBuffer needs positive num_layers, hidden_size and capacity_tokens, got "
                f"{num_layers}, {hidden_size}, {capacity_tokens}"
            )
        self.num_layers = int(num_layers)
        self.hidden_size = int(hidden_size)
        self.capacity_tokens = int(capacity_tokens)
        self.dtype = dtype
        self.device = torch.device(device)
        self.offload_to_host = bool(offload_to_host) and self.device.type == "cuda"
        # every admission scans the slot table, so keep it small: 1024 samples of >=2 tokens is plenty for the
        # buffer sizes Algorithm 1 uses (a few backward batches of 256 tokens)
        self.max_samples = int(max_samples or max(1, min(self.capacity_tokens // 2, 1024)))
        self._uid = uuid.uuid4().hex
        self._owner = True
        self._slots = SharedArray((self.max_samples, _COLS), torch.int64, fill=0)
        self._slots.tensor[:, _SID] = -1
        self._tokens = SharedArray((self.capacity_tokens,), torch.int64, fill=0)
        self._mask = SharedArray((self.capacity_tokens,), torch.bool, fill=0)
        self._control = SharedArray((_RING0 + _RING_LEN,), torch.int64, fill=0)
        self._control.tensor[_RING0:] = _NO_STEP
        shape = (self.num_layers, self.capacity_tokens, self.hidden_size)
        self._data_shm: SharedArray | None = None
        if self.device.type == "cpu" or self.offload_to_host:
            self._data_shm = SharedArray(shape, dtype, fill=None)
            self.data = self._data_shm.tensor
            self._pinned = self.offload_to_host and _pin_host_memory(self.data)
        else:
            self.data = torch.empty(shape, dtype=dtype, device=self.device)
            _LIVE_CUDA[self._uid] = self.data
            self._pinned = False
        self._init_local()

    # ------------------------------------------------------------------------------------------ plumbing

    def _init_local(self) -> None:
        self._slots_np = self._slots.numpy()
        self._control_np = self._control.numpy()
        self._mask_np = self._mask.numpy()
        self._tokens_np = self._tokens.numpy()
        self._lock = threading.Lock()  # serialises reserve/release among the controller's threads only
        # forward-process bookkeeping: step -> sample ids, sample id -> (row, offset, length)
        self._steps: dict[int, list[int]] = {}
        self._capturing: dict[int, tuple[int, int, int]] = {}
        self._pending_async = False

    def __getstate__(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in ("num_layers", "hidden_size", "capacity_tokens", "dtype", "device",
                                                "offload_to_host", "max_samples", "_uid", "_slots", "_tokens",
                                                "_mask", "_control", "_data_shm", "_pinned")}
        if self._data_shm is None:
            from torch.multiprocessing.reductions import reduce_tensor

            state["_cuda"] = (os.getpid(), reduce_tensor(self.data))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        cuda = state.pop("_cuda", None)
        self.__dict__.update(state)
        self._owner = False
        if self._data_shm is not None:
            self.data = self._data_shm.tensor
            # page-locking is per process: register this process's mapping
            self._pinned = self.offload_to_host and _pin_host_memory(self.data)
        else:
            pid, (rebuild, args) = cuda
            live = _LIVE_CUDA.get(self._uid)
            self.data = live if live is not None else rebuild(*args)
        self._init_local()

    def close(self) -> None:
        """Free the shared memory (creator only; other copies just drop their references and page-locking).

        Called by the controller at shutdown, after the host and the backward process stopped using the buffer.
        """
        if self._pinned:
            _unpin_host_memory(self.data.data_ptr())
            self._pinned = False
        if not self._owner:
            return
        for arr in (self._slots, self._tokens, self._mask, self._control, self._data_shm):
            if arr is not None:
                arr.close()
        _LIVE_CUDA.pop(self._uid, None)

    @property
    def bytes_per_token(self) -> int:
        return self.num_layers * self.hidden_size * self.data.element_size()

    # ------------------------------------------------------------------------------ controller: admission

    def _used_rows(self) -> np.ndarray:
        return np.nonzero(self._slots_np[:, _STATE] != SlotState.FREE)[0]

    @property
    def used_tokens(self) -> int:
        rows = self._used_rows()
        return int(self._slots_np[rows, _LEN].sum())

    @property
    def free_tokens(self) -> int:
        """Tokens not held by any slot (Algorithm 1's ``S_max``). Called by the controller before admitting.

        Reservations are contiguous, so after aborts fragment the buffer a sample of ``free_tokens`` tokens may
        still not fit; :meth:`can_reserve` answers exactly.
        """
        return self.capacity_tokens - self.used_tokens

    def _find_gap(self, n: int) -> int | None:
        """First-fit start of ``n`` free contiguous tokens (vectorised: this runs on the scheduler's hot path)."""
        rows = self._used_rows()
        if rows.size == 0:
            return 0 if n <= self.capacity_tokens else None
        offs = self._slots_np[rows, _OFF]
        order = np.argsort(offs, kind="stable")
        offs = offs[order]
        ends = offs + self._slots_np[rows, _LEN][order]
        reach = np.maximum.accumulate(ends)
        prev_end = np.empty_like(reach)
        prev_end[0] = 0
        prev_end[1:] = reach[:-1]
        fits = np.nonzero(offs - prev_end >= n)[0]
        if fits.size:
            return int(prev_end[fits[0]])
        tail = int(reach[-1])
        return tail if self.capacity_tokens - tail >= n else None

    def can_reserve(self, num_tokens: int) -> bool:
        """Whether a sample of ``num_tokens`` tokens fits now (contiguously) and a slot row is free."""
        return bool((self._slots_np[:, _STATE] == SlotState.FREE).any()) and self._find_gap(num_tokens) is not None

    def reserve(self, sample: FineTuneSample) -> Slot | None:
        """Claim a token range for ``sample`` and store its tokens and loss mask; ``None`` when it does not fit.

        Called by the controller (scheduling process) when it admits the sample, before the step that carries it
        is dispatched. Raises :class:`ActivationBufferError` if the sample already holds a slot.
        """
        n = sample.num_tokens
        with self._lock:
            if self._row_of(sample.sample_id) is not None:
                raise ActivationBufferError(
                    f"sample {sample.sample_id} already holds a buffer slot; release it before admitting it again"
                )
            free_rows = np.nonzero(self._slots_np[:, _STATE] == SlotState.FREE)[0]
            if free_rows.size == 0:
                return None
            off = self._find_gap(n)
            if off is None:
                return None
            row = int(free_rows[0])
            self._tokens_np[off:off + n] = np.fromiter(sample.input_ids, dtype=np.int64, count=n)
            self._mask_np[off:off + n] = np.fromiter(sample.loss_mask, dtype=np.bool_, count=n)
            rec = self._slots_np[row]
            rec[_SID], rec[_OFF], rec[_LEN], rec[_DONE] = sample.sample_id, off, n, 0
            rec[_STATE] = SlotState.RESERVED  # written last: the row becomes visible fully formed
            return Slot(row, sample.sample_id, off, n, SlotState.RESERVED)

    def release(self, sample_id: int) -> bool:
        """Free ``sample_id``'s slot (no-op returning ``False`` if it holds none).

        Called by the backward process once a sample's gradients are in the optimizer step, or by the controller
        for samples it drops (aborted, or reset after a backward-process crash).
        """
        with self._lock:
            row = self._row_of(sample_id)
            if row is None:
                return False
            self._free_row(row)
            return True

    def reset(self) -> None:
        """Drop every slot. Called by the controller after a backward-process restart (captures are stale)."""
        with self._lock:
            self._slots_np[:, _SID] = -1
            self._slots_np[:, _STATE] = SlotState.FREE
            self._control_np[_ABORT] = 0
            self._control_np[_RING0:] = _NO_STEP
            self._control_np[_GEN] += 1

    def _free_row(self, row: int) -> None:
        # sample id first: once the state reads FREE the controller may reuse the row and write a new id
        self._slots_np[row, _SID] = -1
        self._slots_np[row, _STATE] = SlotState.FREE

    def _row_of(self, sample_id: int) -> int | None:
        rows = np.nonzero((self._slots_np[:, _SID] == sample_id) & (self._slots_np[:, _STATE] != SlotState.FREE))[0]
        return int(rows[0]) if rows.size else None

    def slot(self, sample_id: int) -> Slot | None:
        row = self._row_of(sample_id)
        if row is None:
            return None
        rec = self._slots_np[row]
        return Slot(row, int(rec[_SID]), int(rec[_OFF]), int(rec[_LEN]), int(rec[_STATE]))

    def slots(self) -> list[Slot]:
        """Every occupied slot, in buffer order (for monitoring and for the controller after a crash)."""
        out = [self.slot(int(self._slots_np[r, _SID])) for r in self._used_rows()]
        return sorted((s for s in out if s is not None), key=lambda s: s.offset)

    def ready_sample_ids(self) -> list[int]:
        """Samples whose capture completed and that wait for the backward, in buffer order."""
        return [s.sample_id for s in self.slots() if s.state == SlotState.READY]

    # ------------------------------------------------------------------------------ controller: abort

    def mark_finetune_only(self, step_id: int) -> None:
        """Declare that step ``step_id`` carries only fine-tuning rows, so it may be aborted.

        Called by the controller when it issues such a step (before the host dispatches it). Up to 6 marked
        steps may be in flight (pipelined hosts); a marker is dropped by the step's ``end_step``.
        """
        ring = self._control_np[_RING0:]
        if (ring == step_id).any():
            return
        empty = np.nonzero(ring == _NO_STEP)[0]
        if empty.size == 0:
            raise ActivationBufferError(
                f"more than {_RING_LEN} fine-tuning-only steps marked without end_step; the host is not calling "
                "end_step for fine-tuning steps"
            )
        ring[int(empty[0])] = step_id

    def request_abort(self) -> bool:
        """Stop every running fine-tuning-only step at its next layer boundary.

        Called by the controller from ``on_arrival`` (any thread) when a client request arrives. Returns whether a
        marked step was in flight (otherwise nothing needs stopping and the flag is left clear).
        """
        if not (self._control_np[_RING0:] != _NO_STEP).any():
            return False
        self._control_np[_ABORT] = 1
        return True

    def clear_abort(self) -> None:
        """Disarm the abort (the controller, once the aborted step's record came back)."""
        self._control_np[_ABORT] = 0

    @property
    def abort_requested(self) -> bool:
        return bool(self._control_np[_ABORT])

    # ------------------------------------------------------------------------------ forward side: the sink

    def begin_step(self, step_id: int, samples: Sequence[FineTuneSample]) -> None:
        """ActivationSink: a step carrying ``samples`` starts (host forward process, before layer 0)."""
        ids: list[int] = []
        for s in samples:
            row = self._row_of(s.sample_id)
            if row is None:
                raise ActivationBufferError(
                    f"step {step_id}: sample {s.sample_id} has no buffer slot; the controller must reserve() every "
                    "sample it admits"
                )
            rec = self._slots_np[row]
            if rec[_STATE] != SlotState.RESERVED:
                raise ActivationBufferError(
                    f"step {step_id}: sample {s.sample_id} is {SlotState.NAMES.get(int(rec[_STATE]))}, expected "
                    "reserved (each admission is captured by exactly one step)"
                )
            if int(rec[_LEN]) != s.num_tokens:
                raise ActivationBufferError(
                    f"step {step_id}: sample {s.sample_id} has {s.num_tokens} tokens, its slot {int(rec[_LEN])}"
                )
            rec[_DONE] = 0
            rec[_STATE] = SlotState.CAPTURING
            self._capturing[s.sample_id] = (row, int(rec[_OFF]), int(rec[_LEN]))
            ids.append(s.sample_id)
        self._steps[step_id] = ids

    def layer_input(self, step_id: int, layer: int, sample_id: int, hidden: torch.Tensor) -> None:
        """ActivationSink: copy the input of ``layer`` for ``sample_id`` into its slot (host forward process)."""
        where = self._capturing.get(sample_id)
        if where is None:
            raise ActivationBufferError(f"step {step_id}: layer_input for sample {sample_id} outside begin/end_step")
        row, off, n = where
        done = int(self._slots_np[row, _DONE])
        if layer != done:
            raise ActivationBufferError(
                f"step {step_id}: sample {sample_id}: got layer {layer}, expected layer {done} (layers must arrive in "
                "order, each exactly once)"
            )
        if hidden.dim() == 3 and hidden.shape[0] == 1:
            hidden = hidden[0]
        if tuple(hidden.shape) != (n, self.hidden_size):
            raise ActivationBufferError(
                f"step {step_id}: sample {sample_id} layer {layer}: hidden has shape {tuple(hidden.shape)}, expected "
                f"({n}, {self.hidden_size})"
            )
        dst = self.data[layer, off:off + n]
        if hidden.device.type == "cuda" and dst.device.type == "cpu":
            # device→host without stalling the host's stream; end_step synchronises before publishing READY
            dst.copy_(hidden.detach(), non_blocking=self._pinned)
            self._pending_async = self._pinned
        else:
            dst.copy_(hidden.detach())
        self._slots_np[row, _DONE] = layer + 1

    def should_abort(self, step_id: int) -> bool:
        """ActivationSink: ``True`` when the controller asked to stop this fine-tuning-only step.

        Called by the host at every layer boundary of fine-tuning-only steps; two shared-memory loads.
        """
        return bool(self._control_np[_ABORT]) and bool((self._control_np[_RING0:] == step_id).any())

    def end_step(self, step_id: int, completed: Sequence[int], aborted: Sequence[int]) -> None:
        """ActivationSink: the step's forward finished; publish complete captures, discard aborted ones."""
        if self._pending_async or self.data.device.type == "cuda":
            # The copies were queued on the host's stream; another process (the backward) may read the slot as
            # soon as it is READY, and CUDA streams do not order work across processes: wait for them here.
            torch.cuda.current_stream().synchronize()
            self._pending_async = False
        errors: list[str] = []
        for sid in completed:
            where = self._capturing.pop(sid, None)
            if where is None:
                errors.append(f"sample {sid} reported completed but was not in the step")
                continue
            row = where[0]
            if int(self._slots_np[row, _DONE]) != self.num_layers:
                self._free_row(row)
                errors.append(f"sample {sid} completed with {int(self._slots_np[row, _DONE])}/{self.num_layers} "
                              "layers captured; its slot was freed")
                continue
            self._slots_np[row, _STATE] = SlotState.READY
        for sid in aborted:
            where = self._capturing.pop(sid, None)
            row = where[0] if where is not None else self._row_of(sid)
            if row is not None:
                self._free_row(row)
        for sid in self._steps.pop(step_id, ()):  # the host forgot some: treat as aborted rather than leak them
            where = self._capturing.pop(sid, None)
            if where is not None:
                self._free_row(where[0])
                errors.append(f"sample {sid} was neither completed nor aborted; its slot was freed")
        ring = self._control_np[_RING0:]
        ring[ring == step_id] = _NO_STEP
        if not (ring != _NO_STEP).any():
            self._control_np[_ABORT] = 0  # no fine-tuning-only step left to stop
        if errors:
            raise ActivationBufferError(f"step {step_id}: " + "; ".join(errors))

    # ------------------------------------------------------------------------------ backward side

    def captured(self, sample_id: int) -> CapturedSample:
        """Zero-copy views of a READY sample. Called by the backward process for each sample it trains on."""
        row = self._row_of(sample_id)
        if row is None or int(self._slots_np[row, _STATE]) != SlotState.READY:
            state = "no slot" if row is None else SlotState.NAMES.get(int(self._slots_np[row, _STATE]))
            raise ActivationBufferError(f"sample {sample_id} is not ready for the backward ({state})")
        off, n = int(self._slots_np[row, _OFF]), int(self._slots_np[row, _LEN])
        return CapturedSample(sample_id, self._tokens.tensor[off:off + n], self._mask.tensor[off:off + n],
                              self.data[:, off:off + n])

    def captured_many(self, sample_ids: Iterable[int]) -> list[CapturedSample]:
        return [self.captured(s) for s in sample_ids]


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


def _unpin_host_memory(ptr: int) -> None:
    if _PINNED.pop(ptr, None) is not None:
        try:
            if int(torch.cuda.cudart().cudaHostUnregister(ptr)) != 0:
                _clear_cuda_last_error()
        except Exception:  # pragma: no cover
            pass


def _pin_host_memory(t: torch.Tensor) -> bool:
    """Page-lock shared host memory so device→host copies can be asynchronous; best effort.

    Pageable memory still works (copies become synchronous), so every failure here degrades, never raises.
    """
    if not torch.cuda.is_available():
        return False
    ptr, size = t.data_ptr(), t.numel() * t.element_size()
    for old, old_size in list(_PINNED.items()):
        if old < ptr + size and ptr < old + old_size:  # stale registration of a mapping that is gone
            _unpin_host_memory(old)
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


# --------------------------------------------------------------------------------------------- a minimal host


class ForwardAborted(RuntimeError):
    """Raised inside :func:`capture_forward`'s layer hook to stop an aborted fine-tuning-only step."""


def capture_forward(model: torch.nn.Module, sink: Any, step_id: int, samples: Sequence[FineTuneSample], *,
                    finetune_only: bool = True) -> tuple[list[int], list[int]]:
    """Run ``samples`` through a transformers (optionally PEFT-wrapped) causal LM and feed ``sink`` like a host.

    The smallest faithful host capture: a forward pre-hook on every decoder layer hands the layer's input to
    ``sink.layer_input`` (and, for a fine-tuning-only step, checks ``sink.should_abort`` first, stopping the forward
    at that layer boundary). Samples run one at a time, unpadded. Returns ``(completed, aborted)`` sample ids after
    calling ``sink.end_step``. Used by tests and benchmarks, and as an executable statement of the capture contract
    for host adapters.
    """
    from .lora_backward import decoder_parts

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = decoder_parts(base)[1]
    current: list[int] = [-1]

    def make_hook(index: int) -> Any:
        def pre_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if finetune_only and sink.should_abort(step_id):
                raise ForwardAborted(f"step {step_id} aborted before layer {index}")
            hidden = args[0] if args else kwargs["hidden_states"]
            sink.layer_input(step_id, index, current[0], hidden[0])
        return pre_hook

    sink.begin_step(step_id, samples)
    handles = [layer.register_forward_pre_hook(make_hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
    device = next(model.parameters()).device
    done: list[int] = []
    aborted: list[int] = []
    try:
        with torch.no_grad():
            for s in samples:
                current[0] = s.sample_id
                # logits only for the last position, as serving engines do (a full-vocabulary head over every row
                # would dwarf a layer and delay the next abort check)
                model(input_ids=torch.tensor(s.input_ids, dtype=torch.long, device=device)[None], use_cache=False,
                      logits_to_keep=1)
                done.append(s.sample_id)
    except ForwardAborted:
        done, aborted = [], [s.sample_id for s in samples]
    finally:
        for h in handles:
            h.remove()
    sink.end_step(step_id, done, aborted)
    return done, aborted
