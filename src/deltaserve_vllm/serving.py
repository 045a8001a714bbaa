"""The engine side of ``vllm serve`` with DeltaServe: the executor, the host hooks and the co-serving runtime.

Under ``vllm serve`` the scheduler and the worker live in the EngineCore process, which vLLM spawns; no
DeltaServe code calls into it from outside. :mod:`.plugin` configures the engine so that it builds, in that
process:

1. :class:`DeltaServeExecutor` (vLLM's one-process executor) -- it registers itself in the serve channel, because
   only the executor can reach the worker (``collective_rpc``) and load LoRA weights (``add_lora``);
2. the worker with :class:`~deltaserve_vllm.worker.DeltaServeWorkerExtension`;
3. the :class:`~deltaserve_vllm.scheduler.DeltaServeScheduler`, whose construction completes the engine and
   calls :func:`start_runtime` (through :meth:`Channel.scheduler_ready <deltaserve_vllm.channel.Channel.scheduler_ready>`).

:class:`ServeRuntime` then attaches the worker hooks, builds :class:`EngineHost` -- the :class:`HostHooks` of this
engine -- and starts the core's :class:`~deltaserve_core.coserve.CoServer` on it with the job config named on the
command line. From then on the engine's own loop drives everything: the scheduler offers each step to the core,
the worker captures and times, and fine-tuning-only steps run when vLLM has no request (``has_requests`` asks
:meth:`ServeRuntime.wants_idle_step`).

The latency model is the stored calibration profile of this host (``deltaserve calibrate --host vllm``, same model
path, dtype and device): calibration drives the engine step by step, which the serving loop cannot lend it, so a
missing profile stops start-up with the command that makes one.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.data_parallel import for_engine, resolve_rank
from deltaserve_core.hostkit import published_name
from deltaserve_core.job_config import JobConfig
from deltaserve_core.job_create import CreatedJob, JobsSettings
from deltaserve_core.job_create import startup_jobs as core_startup_jobs
from deltaserve_core.runtime import EngineRuntime, route_logs
from deltaserve_core.types import ProfileShape, StepRecord

from .channel import SERVE_KEY, SETTINGS_KEY, Channel, get_channel
from .channel_hooks import ChannelHooks
from .executor import TapExecutor
from .graphs import GraphSizes
from .versions import check_supported_vllm

__all__ = [
    "SERVE_FINETUNE_LORA_ID",
    "SETTINGS_KEY",
    "DeltaServeExecutor",
    "EngineHost",
    "ServeRuntime",
    "current_runtime",
    "start_runtime",
    "startup_job",
    "startup_jobs",
]

log = logging.getLogger("deltaserve.vllm")

#: LoRA id of the reserved adapter under ``vllm serve``. The API server numbers the adapters it loads from 1 up,
#: so the reserved adapter takes an id it never reaches (vLLM ids are positive int32).
SERVE_FINETUNE_LORA_ID = 2**31 - 2
#: how long an idle engine waits before retrying a fine-tuning-only step that admitted nothing (backward
#: running, pool exhausted for now). It bounds the delay a newly arrived request can see from DeltaServe.
_IDLE_RETRY_S = 0.002
#: how long a stop without a signal (the engine closed, atexit) waits for a running backward batch
_UNSIGNALLED_STOP_S = 60.0


class DeltaServeExecutor(TapExecutor):
    """DeltaServe's one-process executor, registered in the serve channel so the runtime can reach the worker."""

    def _init_executor(self) -> None:
        super()._init_executor()
        channel = get_channel(SERVE_KEY)
        channel.executor = self
        channel.on_scheduler_ready = lambda scheduler: start_runtime(channel, self.vllm_config)

    def shutdown(self) -> None:
        runtime = _RUNTIME.get("runtime")
        if runtime is not None:
            runtime.stop()
        super().shutdown()


class EngineHost(ChannelHooks):
    """:class:`~deltaserve_core.hooks.HostHooks` of the engine this process runs, for the core's CoServer.

    The hook members are the channel's (:class:`~deltaserve_vllm.channel_hooks.ChannelHooks`); adapter weights go
    through the executor. Publishing writes a folder the API server's resolver serves; calibration is not
    available here (see the module docstring)."""

    name = "vllm"

    def __init__(self, channel: Channel, vllm_config: Any, publish_root: Path | None, work_dir: Path, *,
                 shared_publish: bool = False) -> None:
        """``shared_publish``: other engines (data-parallel ranks of the job) publish the same versions into
        ``publish_root`` (None until a job is created: :meth:`publish_to`)."""
        dist, version = check_supported_vllm()
        self._shared_publish = shared_publish
        from vllm.platforms import current_platform

        model_config = vllm_config.model_config
        self._publish_root = publish_root
        self._init_hooks(channel, lora_owner=channel.executor, finetune_lora_id=SERVE_FINETUNE_LORA_ID,
                         finetune_dir=work_dir, hf_config=model_config.hf_config, model_path=str(model_config.model),
                         dtype=str(model_config.dtype).removeprefix("torch."),
                         device="cpu" if current_platform.is_cpu() else str(current_platform.device_type),
                         max_lora_rank=vllm_config.lora_config.max_lora_rank,
                         max_batch_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
                         engine=dist, engine_version=version,
                         timing_variant="async" if vllm_config.scheduler_config.async_scheduling else "")

    def publish_to(self, publish_root: Path) -> None:
        """Publish into ``publish_root`` from now on (a created job's folder)."""
        self._publish_root = publish_root

    def publish_adapter(self, state: LoraAdapterState) -> str:
        if self._publish_root is None:
            raise RuntimeError("no fine-tuning job runs on this engine: nothing to publish")
        # A new folder per version: the API server's resolver maps a client's model name to a folder once and
        # caches it, and vLLM's prefix cache keys on the adapter, so a version is never overwritten in place.
        self._check_rank(state)
        name = published_name(state.name, state.version)
        # the ranks publish identical weights: the first folder written stays, so none is ever swapped under a reader
        state.save_pretrained(self._publish_root / name, if_absent=self._shared_publish)
        log.info("published adapter %s: request it as model %r", name, name)
        return name

    def retract_adapter(self, name: str) -> None:
        # Clients reach versions through the API server's resolver, in another process: it stops serving one once
        # the core has marked its folder retired (deltaserve_vllm.guard), and the engine's LRU frees the slot.
        log.info("retracted adapter %s: the API server refuses it once its folder is marked retired", name)

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        raise RuntimeError("calibration cannot run inside `vllm serve` (the serving loop owns the engine's steps); "
                           f"run `deltaserve calibrate --host vllm --model {self._model_path} --dtype {self._dtype}` "
                           "before starting the server: it stores the profile this server loads")


class ServeRuntime(EngineRuntime):
    """The CoServer of one ``vllm serve`` engine, and what the engine loop asks of it."""

    def __init__(self, channel: Channel, vllm_config: Any) -> None:
        route_logs_to_vllm()
        settings = vllm_config.additional_config.get(SETTINGS_KEY) or {}
        shutdown_timeout = float(getattr(vllm_config, "shutdown_timeout", 0) or 0)
        startup, dp_rank, engines = _jobs_for_this_engine(settings, vllm_config)
        model_config = vllm_config.model_config
        super().__init__(None, engine="vllm", where="the vLLM engine", dp_rank=dp_rank,
                         grace_s=shutdown_timeout or _UNSIGNALLED_STOP_S * 2,
                         log_every_s=float(settings.get("log_every_s", 10.0)), jobs=_jobs_settings(settings),
                         startup=startup, engines=engines,
                         served_models=tuple(dict.fromkeys(str(n) for n in (
                             model_config.served_model_name, model_config.model) if n)))
        self.channel = channel
        executor = channel.executor
        if executor is None:
            raise RuntimeError("DeltaServe's executor did not start: the engine was configured without the "
                               "deltaserve_vllm plugin (start it through `vllm serve ... --additional-config "
                               "'{\"deltaserve\": {\"job\": \"job.yaml\"}}'`)")
        executor.collective_rpc("deltaserve_attach", args=(SERVE_KEY,))
        if not channel.worker_attached:
            raise RuntimeError("the DeltaServe worker extension did not attach in the EngineCore process")
        sizes = executor.collective_rpc("deltaserve_graph_sizes")[0]
        channel.graph_sizes = GraphSizes.from_worker(sizes)
        self.engine_host = EngineHost(channel, vllm_config, self.publish_root, self.work_dir,
                                      shared_publish=self.dp_rank is not None)
        self._metrics_file: str | None = settings.get("metrics_file")
        self._fruitless_idle = False

    def start(self) -> None:  # type: ignore[override]
        host = self.engine_host
        # calibration steps the engine itself, which only vLLM's busy loop does here
        super().start(host, calibrate_command=f"deltaserve calibrate --host vllm --model {host._model_path} "
                                              f"--dtype {host._dtype}",
                      metrics_snapshot=self._metrics_file)
        self.channel.idle_source = self.wants_idle_step
        self.on_stop(lambda: shutil.rmtree(self.work_dir, ignore_errors=True))
        atexit.register(self.stop)
        # vLLM's EngineCore leaves its loop once the scheduler has no work; the idle step would be work forever,
        # so the signal must end it first (then vLLM's own handler runs).
        self.catch_stop_signals(chain=True)

    def preflight_job(self, job: JobConfig) -> None:
        from deltaserve_core.preflight import check_job

        check_job(job, self.engine_host._model_path, max_lora_rank=self.engine_host._max_lora_rank,
                  how_to_raise_rank=f"or start vLLM with --max-lora-rank {job.lora.r}")

    def wants_idle_step(self) -> bool:
        """Asked by the scheduler's ``has_requests`` when vLLM has no request: should the loop step anyway?

        Yes while the job has work. When the previous idle step ran nothing, wait a little first: the loop
        would otherwise spin on a CPU the backward process may need, and the wait bounds how late a client
        request arriving meanwhile is noticed.

        After a stop signal, once vLLM has drained its requests, this is where the final checkpoint is written
        (:meth:`stop`), on the engine's loop: when the loop ends, vLLM's ``run_engine_core`` resets SIGINT and
        SIGTERM to their defaults *before* it shuts the executor down, and the API server sends its SIGTERM as
        soon as the engine has drained, so a save started from the executor's shutdown could be killed half-way
        (seen when the EngineCore got the terminal's SIGINT after the API server had begun its shutdown)."""
        if self._stop_signalled_at is not None and not self._stopped:
            if threading.current_thread() is threading.main_thread():
                self.stop()
            return False
        if not self.wants_steps:
            return False
        if self._fruitless_idle:
            time.sleep(_IDLE_RETRY_S)
        self._fruitless_idle = not self.channel.last_step_executed
        return True

    def stop_timeout_s(self) -> float:
        if self._stop_signalled_at is None:
            return _UNSIGNALLED_STOP_S  # the engine shut down without a signal (an LLM closed, atexit)
        return super().stop_timeout_s()

    def stop(self) -> None:
        self.channel.idle_source = None
        super().stop()


_RUNTIME: dict[str, ServeRuntime] = {}


def _jobs_settings(settings: dict[str, Any]) -> JobsSettings:
    from .plugin import HOW_TO_ENABLE_JOBS, JOBS_KEY

    # the API server made every path absolute (plugin.configure_engine_args)
    return JobsSettings.from_mapping(settings.get(JOBS_KEY), base=Path.cwd(), where='"deltaserve".jobs',
                                     how_to_enable=HOW_TO_ENABLE_JOBS,
                                     limit_setting='--additional-config "deltaserve".jobs.max_concurrent')


def startup_jobs(settings: dict[str, Any]) -> list[tuple[JobConfig, CreatedJob | None]]:
    """The jobs this server starts with (:func:`deltaserve_core.job_create.startup_jobs`): the job file of
    ``--additional-config``, then the jobs created over HTTP that had not ended, when creating is on; the same
    answer in the API server and in every EngineCore."""
    jobs = _jobs_settings(settings)
    return core_startup_jobs(settings.get("job"), jobs if jobs.data_dir is not None else None)


def startup_job(settings: dict[str, Any]) -> tuple[JobConfig | None, CreatedJob | None]:
    """The newest of :func:`startup_jobs` (None, None without one)."""
    found = startup_jobs(settings)
    return found[-1] if found else (None, None)


def _jobs_for_this_engine(settings: dict[str, Any], vllm_config: Any) -> tuple[
        list[tuple[JobConfig, CreatedJob | None]], int | None, int]:
    """The jobs with their create records, this EngineCore's data-parallel rank (None for jobs of one replica) and
    how many engines this server runs (a data-parallel job runs alone: :func:`_job_for_this_engine`)."""
    from .plugin import DATA_PARALLEL_KEY

    found = startup_jobs(settings)
    if not settings.get(DATA_PARALLEL_KEY) and not any(j.data_parallel.enabled for j, _ in found):
        return found, None, 1
    job, created, rank, engines = _job_for_this_engine(settings, vllm_config)
    return ([(job, created)] if job is not None else []), rank, engines


def _job_for_this_engine(settings: dict[str, Any], vllm_config: Any) -> tuple[
        JobConfig | None, CreatedJob | None, int | None, int]:
    """The job, its create record, this EngineCore's data-parallel rank (None for a job of one replica) and how many
    engines this server runs. Under ``--data-parallel-size`` the API server settled size and rendezvous
    (:func:`~deltaserve_vllm.plugin.configure_data_parallel`) and the rank is vLLM's own (``data_parallel_index``:
    a dense model's EngineCores are reset to rank 0 of size 1, the index stays); else it is ``DELTASERVE_DP_RANK``'s
    when the job file is data-parallel."""
    from .plugin import DATA_PARALLEL_KEY

    job, created = startup_job(settings)
    dp = settings.get(DATA_PARALLEL_KEY)
    if not dp:
        # separate servers of one job (DELTASERVE_DP_RANK) may share checkpoint.dir as much as one server's ranks
        rank = resolve_rank(job.data_parallel) if job is not None and job.data_parallel.enabled else None
        return job, created, rank, 1
    if job is None:
        return None, None, None, int(dp["world_size"])
    job = for_engine(job, int(dp["world_size"]), rendezvous=dp["rendezvous"], flag="--data-parallel-size")
    return job, created, int(vllm_config.parallel_config.data_parallel_index), int(dp["world_size"])


def route_logs_to_vllm() -> None:
    """Send DeltaServe's log lines (fine-tuning progress, publishing, faults) through vLLM's handlers, so they
    appear in the server's output with vLLM's process prefix and format; vLLM configures only its own logger."""
    handlers = list(logging.getLogger("vllm").handlers)
    if not handlers:  # vLLM's logging configuration turned off (VLLM_CONFIGURE_LOGGING=0): still say what happens
        fallback = logging.StreamHandler()
        fallback.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"))
        handlers = [fallback]
    route_logs(handlers, ("deltaserve", "deltaserve_core", "deltaserve_vllm"))


def current_runtime() -> ServeRuntime | None:
    """This process's runtime, once the engine has started it (the worker's jobs calls reach the job through it)."""
    return _RUNTIME.get("runtime")


def start_runtime(channel: Channel, vllm_config: Any) -> ServeRuntime:
    """Build and start the runtime once per process (the scheduler's construction calls this)."""
    runtime = _RUNTIME.get("runtime")
    if runtime is None:
        runtime = ServeRuntime(channel, vllm_config)
        runtime.start()
        _RUNTIME["runtime"] = runtime
    return runtime
