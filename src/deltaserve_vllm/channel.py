"""The in-process meeting point of the host object, the scheduler subclass and the worker extension.

vLLM builds the scheduler and the worker itself (from ``scheduler_cls`` / ``worker_extension_cls`` names), so
the adapter cannot hand them objects directly. The host opens a :class:`Channel` under a fresh key and passes
the key through ``VllmConfig.additional_config`` (the config field vLLM reserves for plugins); both sides look
the channel up by that key. This works when all three live in one process, which is the case for the
in-process engine with DeltaServe's one-process executor (:mod:`.executor`) that the driver path uses (the scheduler, the worker and the
caller share the EngineCore process). Keys keep several engines in one process apart.

Under ``vllm serve`` (see :mod:`.plugin`) nobody opens the channel in advance: the EngineCore runs in a process
of its own, and the key is :data:`SERVE_KEY`. The first of the executor and the scheduler to ask for it creates
it there, and the scheduler's :meth:`Channel.scheduler_ready` starts the engine-side runtime
(:mod:`.serving`), which plays the host's part.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deltaserve_core import hostkit
from deltaserve_core.types import ExecutionMode, StepRecord

#: Request ids of injected fine-tuning rows start with this (the scheduler names them, the worker recognises them).
FINETUNE_REQUEST_PREFIX = "__deltaserve_ft__"

__all__ = ["CONFIG_KEY", "SERVE_KEY", "SETTINGS_KEY", "Channel", "StepPlan", "StepTiming", "close_channel",
           "get_channel", "open_channel"]

#: key of ``VllmConfig.additional_config`` that carries the channel key.
CONFIG_KEY = "deltaserve_channel"
#: the channel key of an engine started by ``vllm serve`` with DeltaServe enabled (one engine per process).
SERVE_KEY = "serve"
#: key of ``--additional-config`` that enables DeltaServe: ``{"deltaserve": {"job": "job.yaml"}}``.
SETTINGS_KEY = "deltaserve"


@dataclass
class StepPlan(hostkit.StepPlan):
    """What the scheduler decided for one step, read by the worker while it runs the step."""

    ft_only: bool = False
    reported: bool = True  # False for the warm-up steps of a profile, which never reach the step sink


@dataclass
class StepTiming:
    """What the worker measured for one step: ``execute_model`` through ``sample_tokens``, device-complete."""

    start: float
    duration: float
    mode: ExecutionMode
    aborted: bool


@dataclass
class Channel(hostkit.HookSlots):
    key: str = ""
    #: LoRARequest (vllm.lora.request) of the reserved adapter; set by set_finetune_adapter.
    finetune_lora: object | None = None
    #: plans and timings keyed by ``id(SchedulerOutput)``: the same object travels scheduler -> worker ->
    #: scheduler within one synchronous step of the in-process engine.
    plans: dict[int, StepPlan] = field(default_factory=dict)
    timings: dict[int, StepTiming] = field(default_factory=dict)
    #: run_idle_step asks the scheduler for one schedule() even when vLLM has no request.
    idle_requested: bool = False
    last_step_executed: bool = False
    #: calibration (``profiling``): no record reaches the sink unless the step is the profiled one
    #: (``profile_samples`` is not None), which is reported with synthetic=True.
    profile_record: StepRecord | None = None
    worker_attached: bool = False
    scheduler_attached: bool = False
    #: the CUDA graphs vLLM captured (set by the host after attach; None or empty: every step is eager).
    graph_sizes: Any = None
    #: serve mode: the engine's executor (set by serving.DeltaServeExecutor) and what runs once the scheduler
    #: exists (the engine-side runtime's start), and the runtime's wish for a fine-tuning-only step.
    executor: Any = None
    on_scheduler_ready: Callable[[Any], None] | None = None
    idle_source: Callable[[], bool] | None = None

    def wants_idle_step(self) -> bool:
        """Whether the scheduler should run a step although vLLM has no request (a fine-tuning-only step)."""
        return self.idle_requested or (self.idle_source is not None and self.idle_source())

    def scheduler_ready(self, scheduler: Any) -> None:
        """Called by the scheduler at the end of its construction: in serve mode the engine is complete then
        (executor, KV cache, CUDA graphs, scheduler), so the engine-side runtime can start."""
        self.scheduler_attached = True
        if self.on_scheduler_ready is not None:
            self.on_scheduler_ready(scheduler)


_CHANNELS: dict[str, Channel] = {}
_LOCK = threading.Lock()


def open_channel() -> Channel:
    with _LOCK:
        key = uuid.uuid4().hex
        channel = _CHANNELS[key] = Channel(key=key)
        return channel


def get_channel(key: str | None) -> Channel:
    with _LOCK:
        if key == SERVE_KEY and key not in _CHANNELS:
            _CHANNELS[key] = Channel(key=key)  # vllm serve: created in the EngineCore process by its first user
        channel = _CHANNELS.get(key) if key else None
    if channel is None:
        raise RuntimeError(
            f"DeltaServe channel {key!r} not found in this process: the vLLM scheduler/worker run in another "
            "process than the host. Use the in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0, "
            "distributed_executor_backend='uni') for the DeltaServe driver path")
    return channel


def close_channel(key: str) -> None:
    with _LOCK:
        _CHANNELS.pop(key, None)
