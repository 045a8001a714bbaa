"""The backward process's own side: the loop the spawned child runs, and what it shares with its controller.

:func:`_child_main` is the entry point :class:`~deltaserve_core.backward_process.BackwardProcess` spawns: it builds
a :class:`~deltaserve_core.lora_backward.LoraBackward` on the shared model, adapter and activation buffer, then
serves commands from the command queue and answers with :class:`BackwardReport` messages. The control words
(heartbeat, state, pause timestamps, step, cancel) are indices into one shared float64 array that both sides read
at every layer boundary. The controller's handle and the protocol's description are in
:mod:`deltaserve_core.backward_process`.
"""

from __future__ import annotations

import math
import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .activation_buffer import ActivationBuffer
from .adapter_state import LoraAdapterState, LoraConfigSpec
from .checkpoint import Checkpoint, load_latest, save_checkpoint
from .lora_backward import BackwardCancelled, StepResult, TrainerConfig
from .shared_memory import SharedArray, SharedFlag

__all__ = ["BackwardReport"]

# shared control words (float64), written by the child unless noted; the controller reads them by the same indices
_HEARTBEAT, _STATE, _PAUSED_AT, _RESUMED_AT, _STEP, _CANCEL, _PID, _LAYER, _NCTL = range(9)
STATE_NAMES = {0: "starting", 1: "idle", 2: "training", 3: "paused", 4: "stopped", 5: "saving"}
_STARTING, _IDLE, _TRAINING, _PAUSED, _STOPPED, _SAVING = range(6)


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
    #: this rank's place in a data-parallel job (None: one replica, the optimizer steps are this process's own)
    data_parallel: Any = None


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
    exch: Any = None
    ready_extra: dict[str, Any] = dict(resumed.extra) if resumed else {}
    if spec.data_parallel is not None:
        exch, replay = _join_data_parallel(spec, trainer, resumed)
        ctl[_STEP] = trainer.step
        ready_extra["dp_replay"] = replay

    def beat() -> None:
        ctl[_HEARTBEAT] = time.monotonic()
        if exch is not None:
            exch.heartbeat()

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
        looked = t0
        while not spec.grant.is_set():
            time.sleep(spec.pause_poll_s)
            beat()
            if orphaned():
                os._exit(0)
            if ctl[_CANCEL]:
                raise BackwardCancelled("cancelled by the controller while paused")
            if exch is not None and time.monotonic() - looked > 0.05:
                looked = time.monotonic()
                if exch.closed():
                    # A rank whose engine keeps the device must not hold the others' global step: it drops its open
                    # share (the controller re-admits those samples) and contributes nothing to this step.
                    raise BackwardCancelled("a global step closed while this rank's backward was paused")
        t1 = time.monotonic()
        ctl[_RESUMED_AT] = t1
        ctl[_STATE] = _TRAINING
        paused_total[0] += t1 - t0

    spec.reports.put(BackwardReport("ready", step=trainer.step, path=str(resumed.path) if resumed else None,
                                    extra=ready_extra if (resumed or exch is not None) else {},
                                    time=time.monotonic()))
    ctl[_STATE] = _IDLE
    while True:
        beat()
        if exch is not None and exch.closed():
            # Parts the controller sent before the step closed were forwarded on this adapter: they belong in it.
            # (One still in the pipe arrives after the step and is refused as stale: exact, only wasted.)
            while True:
                try:
                    cmd = spec.commands.get_nowait()
                except queue.Empty:
                    break
                if not _serve(spec, trainer, exch, cmd, grant, paused_total, cuda):
                    return
            ctl[_STATE] = _TRAINING
            _global_step(spec, trainer, exch)
            ctl[_STEP] = trainer.step
            ctl[_STATE] = _IDLE
            continue
        try:
            cmd = spec.commands.get(timeout=0.05 if exch is None else 0.01)
        except queue.Empty:
            if orphaned():
                return
            continue
        if not _serve(spec, trainer, exch, cmd, grant, paused_total, cuda):
            return


def _serve(spec: _ChildSpec, trainer: Any, exch: Any, cmd: tuple[str, int, Any], grant: Any,
           paused_total: list[float], cuda: bool) -> bool:
    """Run one command from the controller; False once the process must exit (``stop``)."""
    ctl = spec.control.numpy()
    kind, cmd_id, payload = cmd
    if kind == "stop":
        ctl[_STATE] = _STOPPED
        if exch is not None:
            exch.leave()  # the other ranks stop waiting for this one at once
        spec.reports.put(BackwardReport("stopped", cmd_id, step=trainer.step, time=time.monotonic()))
        return False
    if exch is not None and kind == "accumulate":
        payload, version = payload["ids"], int(payload["version"])
        if version != trainer.step:
            # forwarded on an adapter a global step has replaced since: its gradients would be stale
            spec.reports.put(BackwardReport("stale", cmd_id, step=trainer.step, sample_ids=tuple(payload),
                                            message=f"forwarded on adapter step {version}, the adapter is at "
                                                    f"step {trainer.step}", time=time.monotonic()))
            return True
    if exch is not None and kind == "apply":
        exch.close()  # this rank's data ran out: the partial global step goes now
        spec.reports.put(BackwardReport("close_requested", cmd_id, step=trainer.step, time=time.monotonic()))
        return True
    if exch is not None and kind == "train":
        spec.reports.put(BackwardReport("error", cmd_id, step=trainer.step, sample_ids=tuple(payload),
                                        message="a data-parallel rank trains in global steps: send parts "
                                                "(accumulate), not train", time=time.monotonic()))
        return True
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
            if exch is not None:
                exch.add_tokens(sum(s.num_tokens for s in samples))
        ctl[_CANCEL] = 0
        ctl[_STATE] = _IDLE
        return True
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
        if exch is not None:
            # the adapter holds every global step before this one: a restart replays from here
            # and the own samples of global steps after the controller's sample state (``pool_seq``): the backward
            # can be ahead of the controller, and a whole-job restart must not train those samples again
            after = exch.own_ids_after(int(payload.get("pool_seq", exch.seq)))
            payload = {**payload, "dp": {"seq": exch.seq, "rank": exch.rank, "own_after_pool": after}}
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
    return True


def _join_data_parallel(spec: _ChildSpec, trainer: Any, resumed: Checkpoint | None) -> tuple[Any, dict[str, Any]]:
    """Connect to the job's store and replay the global steps decided since the checkpoint this process resumed
    from (or since the start), so its adapter is the other ranks' before it contributes again."""
    from .data_parallel import GradientExchange, connect_store

    dp = spec.data_parallel
    seq = int((resumed.extra.get("dp") or {}).get("seq", 0)) if resumed else 0
    exch = GradientExchange(connect_store(dp), dp, step_tokens=spec.config.backward_batch_tokens, seq=seq)
    own: list[int] = []
    steps = 0
    try:
        exch.check_resume(seq)
        for result in exch.replayable(seq):
            _apply_combined(trainer, result)
            own.extend(result.per_rank.get(dp.rank, {}).get("ids", ()))
            steps += 1
    except LookupError as exc:
        # the controller's wait_ready names this instead of a bare exit code
        spec.reports.put(BackwardReport("error", message=str(exc), time=time.monotonic()))
        raise
    exch.heartbeat(force=True)
    return exch, {"from_seq": seq, "seq": exch.seq, "steps": steps, "own_ids": own}


def _apply_combined(trainer: Any, result: Any) -> str:
    """One decided global step on this rank's trainer: ``""`` (applied), ``"empty"`` (nobody had anything) or what
    was not finite (the step is then skipped on every rank alike: they all hold the same numbers)."""
    from .data_parallel import set_flat_grad

    trainer.optimizer.zero_grad(set_to_none=True)
    if result.empty:
        return "empty"
    if not math.isfinite(result.loss):
        return "loss"
    set_flat_grad(trainer.params, result.grad)
    return trainer.optimizer_step()


def _global_step(spec: _ChildSpec, trainer: Any, exch: Any) -> None:
    """This rank's part of a closed global step: post what it accumulated (possibly nothing), apply the decided
    step, report it. No grant is asked for: the step is decided for every rank and must be applied here too, and
    the update of a LoRA adapter is small next to one layer's backward."""
    from .data_parallel import Contribution, flat_grad

    t0 = time.perf_counter()
    ids, tokens, targets, loss_sum = trainer.accumulated_totals()
    mine = Contribution(flat_grad(trainer.params) if ids else None, targets, tokens, loss_sum, ids)
    trainer.drop_accumulated()
    result = exch.exchange(mine)
    nonfinite = _apply_combined(trainer, result)
    if ids and not result.own_included:
        # decided without this rank (it was late): its samples go back to its pool, the step is applied anyway
        spec.reports.put(BackwardReport("stale", step=trainer.step, sample_ids=ids, time=time.monotonic(),
                                        message=f"global step {result.seq} was decided without rank {exch.rank}"))
    if nonfinite == "empty":
        return
    own = ids if result.own_included else ()
    info = {"seq": result.seq, "ranks": list(result.ranks), "tokens": result.tokens, "targets": result.targets,
            "per_rank": {str(r): {k: v for k, v in m.items() if k != "ids"} for r, m in result.per_rank.items()}}
    spec.reports.put(BackwardReport(
        "nonfinite" if nonfinite else "step", step=trainer.step, loss=result.loss, sample_ids=own,
        tokens=tokens if own else 0, target_tokens=targets if own else 0, duration_s=time.perf_counter() - t0,
        extra={"dp": info}, time=time.monotonic(),
        message=(f"global step {result.seq} skipped: its {nonfinite} were not finite" if nonfinite else "")))
