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
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as tmp
from torch import nn

from .activation_buffer import ActivationBuffer, SharedArray, SharedFlag
from .adapter_state import LoraAdapterState, LoraConfigSpec
from .checkpoint import Checkpoint, load_latest, save_checkpoint
from .lora_backward import BackwardBatcher, BackwardCancelled, StepResult, TrainerConfig

__all__ = [
    "BackwardProcess",
    "BackwardReport",
    "BackwardHealth",
    "BackwardProcessError",
    "share_model_weights",
    "mps_hint",
]

# shared control words (float64), written by the child unless noted
_HEARTBEAT, _STATE, _PAUSED_AT, _RESUMED_AT, _STEP, _CANCEL, _PID, _LAYER, _NCTL = range(9)
STATE_NAMES = {0: "starting", 1: "idle", 2: "training", 3: "paused", 4: "stopped", 5: "saving"}
_STARTING, _IDLE, _TRAINING, _PAUSED, _STOPPED, _SAVING = range(6)


class BackwardProcessError(RuntimeError):
    """The backward process died, hung, or did not answer in time."""


@dataclass(frozen=True, slots=True)
class BackwardReport:
    """One message from the backward process (or, for ``died``, about it).

    ``kind``: ``ready`` (started; ``step`` and ``extra`` of the checkpoint it resumed from, if any), ``step`` (an
    optimizer step finished; ``layer_times_s[l]`` is layer ``l``'s recompute+backward time, pauses excluded),
    ``nonfinite`` (the batch was trained but its loss, gradients or new weights were not finite, so the step was
    skipped: adapter, optimizer state and ``step`` unchanged, the samples consumed; ``message`` says which),
    ``checkpoint`` (``path`` written), ``cancelled`` (adapter unchanged, samples still READY in the buffer),
    ``error`` (``message`` holds the traceback; the adapter is unchanged, the samples stay READY for the controller to
    retry or release, and the process keeps running), ``died`` (``exitcode``), ``stopped``.
    """

    kind: str
    cmd_id: int = -1
    step: int = 0
    loss: float | None = None
    sample_ids: tuple[int, ...] = ()
    tokens: int = 0
    target_tokens: int = 0
    duration_s: float = 0.0
    paused_s: float = 0.0
    path: str | None = None
    message: str = ""
    exitcode: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    layer_times_s: tuple[float, ...] = ()
    time: float = 0.0


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


@dataclass
class _ChildSpec:
    model: nn.Module
    adapter_name: str
    adapter_version: int
    adapter_config: LoraConfigSpec
    base_model_path: str
    adapter_tensors: dict[str, torch.Tensor]
    buffer: ActivationBuffer
    config: TrainerConfig
    grant: SharedFlag
    control: SharedArray
    commands: Any
    reports: Any
    checkpoint_dir: str | None
    keep_checkpoints: int
    resume: bool
    torch_threads: int | None
    sync_each_layer: bool
    pause_poll_s: float
    release_consumed: bool


def _step_kind(result: StepResult) -> str:
    return "nonfinite" if result.nonfinite else "step"


def _nonfinite_message(result: StepResult) -> str:
    if not result.nonfinite:
        return ""
    return (f"batch of samples {list(result.sample_ids)} skipped: its {result.nonfinite} were not finite (loss "
            f"{result.loss}); the adapter and the optimizer state are unchanged at step {result.step}")


def _child_main(spec: _ChildSpec) -> None:
    """Entry point of the spawned backward process: build the trainer on the shared tensors, then serve commands."""
    from .lora_backward import LoraBackward

    # The controller stops this process (stop command, kill). A terminal's Ctrl-C, `timeout` and systemd signal the
    # whole process group: ignoring them here lets the controller write its final checkpoint first. A child whose
    # controller is gone (killed outright) exits by itself: see `orphaned`.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = os.getppid()

    def orphaned() -> bool:
        return os.getppid() != parent
    ctl = spec.control.numpy()
    ctl[_PID] = os.getpid()
    ctl[_HEARTBEAT] = time.monotonic()
    if spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)
    model = spec.model
    model.eval()  # the host's forward applies no dropout; the recompute must match it
    adapter = LoraAdapterState(spec.adapter_name, spec.adapter_version, spec.adapter_config, spec.adapter_tensors,
                               spec.base_model_path)
    trainer = LoraBackward(model, adapter, spec.config)
    cuda = trainer.device.type == "cuda"
    trainer.sync_timing = cuda and spec.sync_each_layer
    resumed: Checkpoint | None = None
    if spec.resume and spec.checkpoint_dir:
        resumed = load_latest(spec.checkpoint_dir, map_location=trainer.device)
        if resumed is not None:
            trainer.load_adapter_tensors(resumed.adapter.tensors)
            if resumed.optimizer_state is not None:
                trainer.load_optimizer_state(resumed.optimizer_state, resumed.step)
            else:
                trainer.step = resumed.step
    ctl[_STEP] = trainer.step
    paused_total = [0.0]

    def beat() -> None:
        ctl[_HEARTBEAT] = time.monotonic()

    def grant() -> None:
        # called at every unit boundary (layer x sample, output head): keep it to a few shared-memory loads/stores.
        # On CUDA the trainer already synchronised after the unit (sync_timing), so a pause leaves no queued work.
        beat()
        if ctl[_CANCEL]:
            raise BackwardCancelled("cancelled by the controller")
        if spec.grant.is_set():
            return
        t0 = time.monotonic()
        ctl[_PAUSED_AT] = t0
        ctl[_STATE] = _PAUSED
        while not spec.grant.is_set():
            time.sleep(spec.pause_poll_s)
            beat()
            if orphaned():
                os._exit(0)
            if ctl[_CANCEL]:
                raise BackwardCancelled("cancelled by the controller while paused")
        t1 = time.monotonic()
        ctl[_RESUMED_AT] = t1
        ctl[_STATE] = _TRAINING
        paused_total[0] += t1 - t0

    spec.reports.put(BackwardReport("ready", step=trainer.step, path=str(resumed.path) if resumed else None,
                                    extra=resumed.extra if resumed else {}, time=time.monotonic()))
    ctl[_STATE] = _IDLE
    while True:
        beat()
        try:
            cmd = spec.commands.get(timeout=0.05)
        except queue.Empty:
            if orphaned():
                return
            continue
        kind, cmd_id, payload = cmd
        if kind == "stop":
            ctl[_STATE] = _STOPPED
            spec.reports.put(BackwardReport("stopped", cmd_id, step=trainer.step, time=time.monotonic()))
            return
        if kind == "accumulate":
            # one part of a larger optimizer step (see LoraBackward.accumulate); a failure drops the whole open step,
            # and the report names every sample of it so the controller can hand them back
            ctl[_STATE] = _TRAINING
            held = trainer.accumulated_ids
            try:
                samples = spec.buffer.captured_many(payload)
                trainer.accumulate(samples, grant)
            except BackwardCancelled as exc:
                spec.reports.put(BackwardReport("cancelled", cmd_id, step=trainer.step,
                                                sample_ids=held + tuple(payload), message=str(exc),
                                                time=time.monotonic()))
            except Exception:
                trainer.drop_accumulated()
                spec.reports.put(BackwardReport("error", cmd_id, step=trainer.step, sample_ids=held + tuple(payload),
                                                message=traceback.format_exc(), time=time.monotonic()))
            else:
                if cuda:
                    torch.cuda.synchronize(trainer.device)  # before the parent may overwrite the released slots
                if spec.release_consumed:
                    for sid in payload:
                        spec.buffer.release(sid)
                spec.reports.put(BackwardReport("accumulated", cmd_id, step=trainer.step, sample_ids=tuple(payload),
                                                time=time.monotonic()))
            ctl[_CANCEL] = 0
            ctl[_STATE] = _IDLE
            continue
        if kind in ("train", "apply"):
            ctl[_STATE] = _TRAINING
            paused_total[0] = 0.0
            held = trainer.accumulated_ids
            try:
                if kind == "apply":
                    result = trainer.apply_accumulated(grant)
                else:
                    samples = spec.buffer.captured_many(payload)
                    result = trainer.train_step(samples, grant)
            except BackwardCancelled as exc:
                trainer.drop_accumulated()
                spec.reports.put(BackwardReport("cancelled", cmd_id, step=trainer.step,
                                                sample_ids=held + tuple(payload or ()),
                                                message=str(exc), time=time.monotonic()))
            except Exception:
                trainer.drop_accumulated()
                spec.reports.put(BackwardReport("error", cmd_id, step=trainer.step,
                                                sample_ids=held + tuple(payload or ()),
                                                message=traceback.format_exc(), time=time.monotonic()))
            else:
                if cuda:
                    # the parent reads the adapter and may overwrite released slots as soon as it hears back
                    torch.cuda.synchronize(trainer.device)
                if spec.release_consumed and kind == "train":
                    for sid in result.sample_ids:
                        spec.buffer.release(sid)
                ctl[_STEP] = trainer.step
                spec.reports.put(BackwardReport(
                    _step_kind(result), cmd_id, step=result.step, loss=result.loss, sample_ids=result.sample_ids,
                    tokens=result.tokens, target_tokens=result.target_tokens, duration_s=result.duration_s,
                    paused_s=paused_total[0], layer_times_s=result.layer_times_s,
                    message=_nonfinite_message(result), time=time.monotonic()))
            ctl[_CANCEL] = 0  # a cancel request applies to one batch only
            ctl[_STATE] = _IDLE
        elif kind == "save":
            ctl[_STATE] = _SAVING
            try:
                if not spec.checkpoint_dir:
                    raise ValueError("this BackwardProcess has no checkpoint_dir")
                path = save_checkpoint(spec.checkpoint_dir, trainer.adapter_state(), trainer.optimizer_state(),
                                       trainer.step, payload, keep_last=spec.keep_checkpoints)
            except Exception:
                spec.reports.put(BackwardReport("error", cmd_id, step=trainer.step, message=traceback.format_exc(),
                                                time=time.monotonic()))
            else:
                spec.reports.put(BackwardReport("checkpoint", cmd_id, step=trainer.step, path=str(path),
                                                extra=dict(payload), time=time.monotonic()))
            ctl[_STATE] = _IDLE
        else:
            spec.reports.put(BackwardReport("error", cmd_id, message=f"unknown command {kind!r}",
                                            time=time.monotonic()))


class BackwardProcess:
    """Controller-side handle of the backward process (one per fine-tuning job).

    Args:
        model: the base causal LM, on the device the backward should use (CPU: call :func:`share_model_weights`
            first, or it is done here).
        adapter: initial adapter; on CPU its tensors are copied once into shared memory (CUDA tensors are used as
            they are), and those become the live trainable weights exposed as :attr:`adapter`.
        buffer: the activation buffer the host feeds.
        config: optimizer and batching settings (``backward_batch_tokens`` drives :meth:`submit_captured`).
        checkpoint_dir, keep_checkpoints: where ``save`` commands write and restarts resume from.
        hang_timeout_s: heartbeat age after which the child counts as hung. The heartbeat beats at every layer
            boundary and every 50 ms when idle or paused, so this must exceed one layer's backward time.
        torch_threads: ``torch.set_num_threads`` in the child (``None``: torch's default for the environment).
        sync_each_layer: on CUDA, synchronise the child's stream at each layer boundary (bounds preemption latency).
        pause_poll_s: how often a paused child looks at the grant again (resume latency).
        release_consumed: the child frees the buffer slots of every sample it trained on (the paper's behaviour).

    All methods are called by the controller, from one thread.
    """

    def __init__(self, model: nn.Module, adapter: LoraAdapterState, buffer: ActivationBuffer, *,
                 config: TrainerConfig = TrainerConfig(), checkpoint_dir: str | os.PathLike[str] | None = None,
                 keep_checkpoints: int = 3, hang_timeout_s: float = 120.0, torch_threads: int | None = None,
                 sync_each_layer: bool = True, pause_poll_s: float = 0.0005, release_consumed: bool = True) -> None:
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
        self.batcher = BackwardBatcher(config.backward_batch_tokens)
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
                          self.release_consumed)
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
                    raise BackwardProcessError(
                        f"backward process exited during start-up (exit code {self._proc.exitcode})")
                if time.monotonic() > deadline:
                    raise BackwardProcessError(f"backward process not ready after {timeout:.0f} s")
                continue
            if rep.kind == "ready":
                self.last_step = rep.step
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
        self.batcher.clear()
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

    def accumulate(self, sample_ids: Sequence[int]) -> int:
        """Add these captured samples to the open optimizer step (their gradients; the adapter does not change).

        Admission may go on while this runs: every forward until :meth:`apply` uses the same adapter. Their buffer
        slots are freed as soon as their part is done."""
        ids = tuple(int(s) for s in sample_ids)
        if not ids:
            raise ValueError("accumulate needs at least one sample")
        return self._send("accumulate", list(ids), ids)

    def apply(self) -> int:
        """Apply the open optimizer step (after every queued :meth:`accumulate`); reported as a ``step``."""
        return self._send("apply", None)

    def submit_captured(self, sample_ids: Sequence[int]) -> int | None:
        """Add samples whose capture completed; dispatch a batch once ``backward_batch_tokens`` is reached.

        Called by the controller after each step that carried fine-tuning rows, with the step's completed ids.
        Returns the command id of a dispatched batch, else ``None``.
        """
        batch = None
        for sid in sample_ids:
            slot = self.buffer.slot(sid)
            if slot is None:
                raise BackwardProcessError(f"sample {sid} holds no buffer slot")
            got = self.batcher.add(sid, slot.num_tokens)
            if got is not None:
                if batch is not None:  # pragma: no cover - a second batch inside one call: send the first now
                    self.train_batch(batch)
                batch = got
        return self.train_batch(batch) if batch is not None else None

    def flush(self) -> int | None:
        """Dispatch a partial batch (end of data, or before a checkpoint)."""
        batch = self.batcher.flush()
        return self.train_batch(batch) if batch else None

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
