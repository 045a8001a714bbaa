"""The backward process: trains the fine-tuning adapter beside the inference engine, yielding to it per layer.

:class:`BackwardProcess` is created and driven by the controller (the core's scheduler side, in the host's
scheduling process). It starts a child with the ``spawn`` start method that maps, without copying:

* the **base weights**: the parent passes its ``nn.Module`` through ``torch.multiprocessing``'s pickler. On CPU the
  parameters are first moved into shared memory (:func:`share_model_weights`, one copy at start-up, after which the
  parent's own model uses the shared pages); on GPU the same pickler sends CUDA IPC handles, so the child's model
  points at the very allocations the parent made;
* the **trainable adapter**: its tensors are shared the same way, and the child's optimizer updates them in place,
  so the parent sees every step in :attr:`BackwardProcess.adapter` (the controller copies a snapshot to the host with
  ``set_finetune_adapter``/``publish_adapter``; the live tensors are never served directly);
* the **activation buffer** (:class:`~deltaserve_core.activation_buffer.ActivationBuffer`, re-mapped by name).

Control is split by urgency. Commands (``train``, ``accumulate``/``apply`` for an optimizer step sent in parts,
``save``, ``stop``) and reports (``ready``, ``step``, ``nonfinite``, ``accumulated``, ``checkpoint``, ``error``,
``cancelled``, ``died``) travel through two queues. The GPU grant
(:attr:`BackwardProcess.grant`), the heartbeat and the pause timestamps are words in shared memory, read or written at
every layer boundary without system calls.

GPU use and CUDA MPS
--------------------
On a GPU the child should run under CUDA MPS so its kernels can run *concurrently* with the engine's (the paper's
decode/backward overlap) from a separate CUDA context. Start the daemon before the inference engine, with the same
environment in every process that uses the GPU::

    export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/tmp/nvidia-mps-log
    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
    nvidia-cuda-mps-control -d            # stop later with: echo quit | nvidia-cuda-mps-control

Without MPS everything still works and stays exact (CUDA IPC does not need MPS), but the two processes' contexts are
time-sliced by the driver: backward kernels never overlap decode, and a prefill that arrives mid-slice may wait for
the slice to end in addition to the one layer the grant costs. :func:`mps_hint` reports what this process sees.
Preemption on GPU: after each unit of work (one layer of one sample, or one sample's output head) the child
synchronises its device (``sync_each_layer``), so when it pauses no backward kernels are left queued and the latency is
bounded by one unit. Verified on one H200 (torch 2.11, CUDA 13) under MPS started as above: base weights, adapter
and activation buffer shared through CUDA IPC, gradients bit-identical to the plain PEFT step in bf16, preemption
latency within one unit (benchmarks/backward_throughput.py; figures in docs/benchmarks.md). At the parent's exit
torch may warn "Producer process has been terminated before all shared CUDA tensors released": the child held
IPC references until it exited; nothing leaks (the driver frees the memory with the last process).

Fault tolerance
---------------
The parent notices a dead child through its exit code (:meth:`BackwardProcess.poll` yields a ``died`` report,
:meth:`BackwardProcess.health`), and a hung one through the heartbeat (:attr:`BackwardHealth.hung`).
:meth:`BackwardProcess.restart` kills what is left, drops the buffer's captures (they were made with weights the
restarted process may not have), and starts a new child that loads the newest checkpoint in place into the shared
adapter together with the optimizer state and step. The controller restores its data pool from the returned
checkpoint's ``extra``: samples trained after that checkpoint are trained again, captured-but-untrained ones go back
to the pool; nothing is lost.
"""

from __future__ import annotations

import os
import queue
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.multiprocessing as tmp
from torch import nn

from .activation_buffer import ActivationBuffer
from .adapter_state import LoraAdapterState
from .backward_child import (
    _CANCEL,
    _HEARTBEAT,
    _NCTL,
    _PAUSED_AT,
    _STATE,
    _STEP,
    STATE_NAMES,
    BackwardReport,
    _child_main,
    _ChildSpec,
)
from .checkpoint import Checkpoint, load_latest
from .lora_backward import TrainerConfig
from .shared_memory import SharedArray, SharedFlag

if TYPE_CHECKING:  # annotation only: data_parallel imports the pool, which this module need not load
    from .data_parallel import DataParallelRank

__all__ = [
    "BackwardProcess",
    "BackwardReport",
    "BackwardHealth",
    "BackwardProcessError",
    "share_model_weights",
    "mps_hint",
]


class BackwardProcessError(RuntimeError):
    """The backward process died, hung, or did not answer in time."""


@dataclass(frozen=True, slots=True)
class BackwardHealth:
    alive: bool
    exitcode: int | None
    state: str
    step: int
    heartbeat_age_s: float
    hung: bool


def share_model_weights(model: nn.Module) -> nn.Module:
    """Move a CPU model's parameters and buffers into shared memory, in place (GPU tensors are left alone).

    Called once by the controller before :meth:`BackwardProcess.start`; afterwards both processes use the same pages.
    """
    for t in list(model.parameters()) + list(model.buffers()):
        if t.device.type == "cpu":
            t.share_memory_()
    return model


def mps_hint() -> str:
    """One line saying whether this process looks like a CUDA MPS client, for logs and error messages."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    if Path(pipe, "control").exists():
        return f"CUDA MPS control pipe found in {pipe}: the backward process runs as an MPS client"
    return (f"no CUDA MPS daemon found (pipe dir {pipe}); backward and inference kernels will be time-sliced, not "
            "overlapped. Start one with `nvidia-cuda-mps-control -d` (see deltaserve_core.backward_process)")


class BackwardProcess:
    """Controller-side handle of the backward process (one per fine-tuning job).

    Args:
        model: the base causal LM, on the device the backward should use (CPU: call :func:`share_model_weights`
            first, or it is done here).
        adapter: initial adapter; on CPU its tensors are copied once into shared memory (CUDA tensors are used as
            they are), and those become the live trainable weights exposed as :attr:`adapter`.
        buffer: the activation buffer the host feeds.
        config: optimizer and batching settings.
        checkpoint_dir, keep_checkpoints: where ``save`` commands write and restarts resume from.
        hang_timeout_s: heartbeat age after which the child counts as hung. The heartbeat beats at every layer
            boundary and every 50 ms when idle or paused, so this must exceed one layer's backward time.
        torch_threads: ``torch.set_num_threads`` in the child (``None``: torch's default for the environment).
        sync_each_layer: on CUDA, synchronise the child's stream at each layer boundary (bounds preemption latency).
        pause_poll_s: how often a paused child looks at the grant again (resume latency).
        release_consumed: the child frees the buffer slots of every sample it trained on (the paper's behaviour).
        data_parallel: this rank's :class:`~deltaserve_core.data_parallel.DataParallelRank` in a job over several
            replicas: the child then trains in global steps (parts with :meth:`accumulate` and their adapter
            version; :meth:`apply` closes the open global step early), resumes by replaying the store's decided
            steps after its checkpoint, and reports steps it did not ask for. ``None``: one replica.

    All methods are called by the controller, from one thread.
    """

    def __init__(self, model: nn.Module, adapter: LoraAdapterState, buffer: ActivationBuffer, *,
                 config: TrainerConfig = TrainerConfig(), checkpoint_dir: str | os.PathLike[str] | None = None,
                 keep_checkpoints: int = 3, hang_timeout_s: float = 120.0, torch_threads: int | None = None,
                 sync_each_layer: bool = True, pause_poll_s: float = 0.0005, release_consumed: bool = True,
                 data_parallel: DataParallelRank | None = None) -> None:
        self.model = share_model_weights(model)
        tensors = {}
        for k, v in adapter.tensors.items():
            t = v.detach()
            if t.device.type == "cpu":
                t = t.clone().share_memory_()
            tensors[k] = t
        self.adapter = LoraAdapterState(adapter.name, adapter.version, adapter.config, tensors, adapter.base_model_path)
        self._initial = {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}
        self.buffer = buffer
        self.config = config
        self.checkpoint_dir = str(checkpoint_dir) if checkpoint_dir is not None else None
        self.keep_checkpoints = keep_checkpoints
        self.hang_timeout_s = hang_timeout_s
        self.torch_threads = torch_threads
        self.sync_each_layer = sync_each_layer
        self.pause_poll_s = pause_poll_s
        self.release_consumed = release_consumed
        self.data_parallel = data_parallel
        #: the child's last ``ready`` report (a data-parallel restart's replay is in its ``extra["dp_replay"]``)
        self.last_ready: BackwardReport | None = None
        #: the GPU grant: set = the backward may run; the controller clears it before steps with prefill tokens
        self.grant = SharedFlag(True)
        self._control = SharedArray((_NCTL,), torch.float64, fill=0)
        self._ctl = self._control.numpy()
        self._ctx = tmp.get_context("spawn")
        self._proc: Any = None
        self._commands: Any = None
        self._reports: Any = None
        self._next_id = 0
        self._in_flight: dict[int, tuple[str, tuple[int, ...]]] = {}
        self._backlog: list[BackwardReport] = []
        self._died_reported = False
        self._stopping = False
        self.last_step = 0

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self, *, resume: bool = False) -> None:
        """Spawn the child (returns at once; :meth:`wait_ready` blocks until it has built the trainer).

        With ``resume`` the child loads the newest checkpoint of ``checkpoint_dir`` into the shared adapter.
        """
        if self._proc is not None and self._proc.is_alive():
            raise BackwardProcessError("backward process already running")
        self._commands = self._ctx.Queue()
        self._reports = self._ctx.Queue()
        self._ctl[:] = 0
        self._ctl[_HEARTBEAT] = time.monotonic()
        self._died_reported = False
        self._stopping = False
        spec = _ChildSpec(self.model, self.adapter.name, self.adapter.version, self.adapter.config,
                          self.adapter.base_model_path, dict(self.adapter.tensors), self.buffer, self.config,
                          self.grant, self._control, self._commands, self._reports, self.checkpoint_dir,
                          self.keep_checkpoints, resume, self.torch_threads, self.sync_each_layer, self.pause_poll_s,
                          self.release_consumed, self.data_parallel)
        self._proc = self._ctx.Process(target=_child_main, args=(spec,), name="deltaserve-backward", daemon=True)
        self._proc.start()

    def wait_ready(self, timeout: float = 300.0) -> BackwardReport:
        """Block until the child reported ``ready`` (it imports torch/transformers: seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                rep = self._reports.get(timeout=0.1)
            except queue.Empty:
                if not self._proc.is_alive():
                    why = [r.message for r in self._backlog if r.kind == "error" and r.message]
                    raise BackwardProcessError(
                        f"backward process exited during start-up (exit code {self._proc.exitcode})"
                        + (f": {why[-1]}" if why else ""))
                if time.monotonic() > deadline:
                    raise BackwardProcessError(f"backward process not ready after {timeout:.0f} s")
                continue
            if rep.kind == "ready":
                self.last_step = rep.step
                self.last_ready = rep
                return rep
            self._backlog.append(rep)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the child to exit after its current command; kill it if it does not within ``timeout``."""
        if self._proc is None:
            return
        self._stopping = True
        if self._proc.is_alive():
            self._ctl[_CANCEL] = 1  # abandon a batch in progress rather than finishing it
            self.grant.set()
            self._commands.put(("stop", self._new_id(), None))
            self._proc.join(timeout)
        if self._proc.is_alive():
            self.kill()
        self._proc.join(1.0)

    def kill(self) -> None:
        """SIGKILL the child (used by :meth:`restart` and by tests that simulate a crash)."""
        if self._proc is not None and self._proc.is_alive():
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.join(5.0)

    def close(self) -> None:
        """Stop the child, free the control words (the buffer belongs to the controller) and drop the base model:
        on a GPU it is a second copy of the weights, which a process that co-serves several jobs one after the
        other (the benchmarks do) would otherwise keep per job until it runs out of memory."""
        self.stop()
        self._control.close()
        self.grant.close()
        self.model = None  # type: ignore[assignment]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def restart(self, *, reset_buffer: bool = True, timeout: float = 300.0) -> Checkpoint | None:
        """Replace a dead or hung child with a fresh one resumed from the newest checkpoint.

        Returns that checkpoint (``None``: no checkpoint, the adapter was reset to its initial weights) so the
        controller can rewind its data pool with ``checkpoint.extra``. Blocks until the new child is ready.
        """
        self.kill()
        if self._proc is not None:
            self._proc.join(5.0)
        ck = load_latest(self.checkpoint_dir) if self.checkpoint_dir else None
        if ck is None:
            with torch.no_grad():
                for k, t in self.adapter.tensors.items():
                    t.copy_(self._initial[k])
        if reset_buffer:
            self.buffer.reset()
        self._in_flight.clear()
        self._backlog.clear()
        self.start(resume=True)
        self.wait_ready(timeout)
        return ck

    # ------------------------------------------------------------------------------------------ commands

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _send(self, kind: str, payload: Any, ids: tuple[int, ...] = ()) -> int:
        if self._proc is None or not self._proc.is_alive():
            raise BackwardProcessError(
                f"backward process is not running (exit code {None if self._proc is None else self._proc.exitcode}); "
                "call restart()"
            )
        cmd_id = self._new_id()
        self._in_flight[cmd_id] = (kind, ids)
        self._commands.put((kind, cmd_id, payload))
        return cmd_id

    def train_batch(self, sample_ids: Sequence[int]) -> int:
        """Run one optimizer step over these captured samples (in this order); returns the command id.

        The samples must be READY in the buffer. The controller admits nothing while :attr:`busy`.
        """
        ids = tuple(int(s) for s in sample_ids)
        if not ids:
            raise ValueError("train_batch needs at least one sample")
        return self._send("train", list(ids), ids)

    def accumulate(self, sample_ids: Sequence[int], version: int | None = None) -> int:
        """Add these captured samples to the open optimizer step (their gradients; the adapter does not change).

        Admission may go on while this runs: every forward until :meth:`apply` uses the same adapter. Their buffer
        slots are freed as soon as their part is done. ``version``: the adapter step their forward ran on, required
        with data parallelism (a global step may land between the forward and this part: the child then refuses the
        part as ``stale``), ignored without."""
        ids = tuple(int(s) for s in sample_ids)
        if not ids:
            raise ValueError("accumulate needs at least one sample")
        if self.data_parallel is not None:
            if version is None:
                raise ValueError("a data-parallel rank's parts need the adapter version their forward ran on")
            return self._send("accumulate", {"ids": list(ids), "version": int(version)}, ids)
        return self._send("accumulate", list(ids), ids)

    def apply(self) -> int:
        """Apply the open optimizer step (after every queued :meth:`accumulate`); reported as a ``step``."""
        return self._send("apply", None)

    def save_checkpoint(self, extra: Mapping[str, Any] | None = None) -> int:
        """Ask the child to write a checkpoint (after any queued training); ``extra`` must be JSON-serialisable."""
        return self._send("save", dict(extra or {}))

    def cancel_current(self) -> None:
        """Abandon the batch in progress (or, if none runs, the next one) at its next layer boundary.

        The abandoned batch's samples stay READY in the buffer and the adapter is unchanged.
        """
        self._ctl[_CANCEL] = 1

    # ------------------------------------------------------------------------------------------ reports

    @property
    def busy(self) -> bool:
        """Whether an optimizer step is queued or running (``train`` or ``apply``): Algorithm 1 admits nothing while
        this holds. Parts of an open step (``accumulate``) do not count: forwards until its ``apply`` use the same
        adapter."""
        return any(kind in ("train", "apply") for kind, _ in self._in_flight.values())

    @property
    def accumulating(self) -> bool:
        """Whether parts of an open optimizer step are queued or running."""
        return any(kind == "accumulate" for kind, _ in self._in_flight.values())

    def poll(self, timeout: float = 0.0) -> list[BackwardReport]:
        """Collect reports (waiting up to ``timeout`` for the first). Adds a ``died`` report once if the child died."""
        out, self._backlog = self._backlog, []
        if self._reports is not None:
            block = timeout > 0 and not out
            while True:
                try:
                    rep = self._reports.get(timeout=timeout) if block else self._reports.get_nowait()
                except (queue.Empty, OSError, EOFError):
                    break
                block = False
                out.append(rep)
        for rep in out:
            self._in_flight.pop(rep.cmd_id, None)
            if rep.kind == "step":
                self.last_step = rep.step
        if (self._proc is not None and not self._proc.is_alive() and not self._stopping
                and not self._died_reported):
            self._died_reported = True
            out.append(BackwardReport("died", exitcode=self._proc.exitcode, step=self.last_step,
                                      message=f"backward process exited with code {self._proc.exitcode}",
                                      time=time.monotonic()))
        return out

    def wait(self, cmd_id: int, timeout: float = 300.0) -> BackwardReport:
        """Block until command ``cmd_id`` is answered; other reports stay queued for :meth:`poll`.

        Raises :class:`BackwardProcessError` if the child dies or hangs first.
        """
        deadline = time.monotonic() + timeout
        keep: list[BackwardReport] = []
        try:
            while True:
                for rep in self.poll(0.05):
                    if rep.cmd_id == cmd_id:
                        return rep
                    if rep.kind == "died":
                        keep.append(rep)
                        raise BackwardProcessError(rep.message)
                    keep.append(rep)
                h = self.health()
                if h.hung:
                    raise BackwardProcessError(f"backward process hung (no heartbeat for {h.heartbeat_age_s:.1f} s)")
                if time.monotonic() > deadline:
                    raise BackwardProcessError(f"no answer to command {cmd_id} within {timeout:.0f} s")
        finally:
            self._backlog = keep + self._backlog

    def health(self) -> BackwardHealth:
        """Liveness, state and heartbeat age; ``hung`` when alive but silent for longer than ``hang_timeout_s``."""
        alive = self._proc is not None and self._proc.is_alive()
        age = time.monotonic() - float(self._ctl[_HEARTBEAT])
        return BackwardHealth(alive=alive, exitcode=None if self._proc is None else self._proc.exitcode,
                              state=STATE_NAMES.get(int(self._ctl[_STATE]), "?"), step=int(self._ctl[_STEP]),
                              heartbeat_age_s=age, hung=alive and age > self.hang_timeout_s)

    @property
    def state(self) -> str:
        return STATE_NAMES.get(int(self._ctl[_STATE]), "?")

    @property
    def paused_at(self) -> float:
        """``time.monotonic()`` at which the child last paused for a cleared grant (0 if never)."""
        return float(self._ctl[_PAUSED_AT])

    def adapter_snapshot(self, version: int | None = None) -> LoraAdapterState:
        """A copy of the live adapter for ``set_finetune_adapter``/``publish_adapter`` (call while not :attr:`busy`)."""
        return self.adapter.with_tensors({k: v.detach().clone() for k, v in self.adapter.tensors.items()},
                                         version=self.last_step if version is None else version)
