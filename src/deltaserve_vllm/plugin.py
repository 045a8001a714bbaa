"""vLLM general plugin: ``vllm serve`` with DeltaServe enabled by one switch.

Operators start vLLM's own server and name a fine-tuning job::

    vllm serve MODEL --enable-lora --additional-config '{"deltaserve": {"job": "job.yaml"}}'

vLLM loads the ``vllm.general_plugins`` entry point ``deltaserve`` in every process it starts and calls
:func:`register`. Registration is cheap and idempotent (vLLM may call it several times per process) and changes
nothing unless an engine is configured with the ``deltaserve`` key: then, in the process that builds the engine
config (the API server), :func:`configure_engine_args` fills in what co-serving needs --

- ``scheduler_cls`` / ``worker_extension_cls``: DeltaServe's scheduler and worker extension;
- ``distributed_executor_backend``: :class:`~deltaserve_vllm.serving.DeltaServeExecutor`, vLLM's one-process
  executor, so the scheduler, the worker and the runtime share the EngineCore process;
- ``enable_lora`` on and one more LoRA slot (``max_loras``) for the reserved fine-tuning adapter;
- the DeltaServe scheduler class matching the engine loop vLLM settles on (async scheduling, the model runner,
  torch.compile and CUDA graphs are left as the operator set them, or vLLM's defaults);
- in the API server process, :mod:`.guard`: clients request each published adapter version by name
  (``<adapter>@v<step>``) with vLLM's runtime LoRA loading left exactly as the operator set it, and, where the
  operator turned it on, no client load or unload can touch DeltaServe's names, folders or versions;
- ``shutdown_timeout`` of at least ``shutdown_grace_s`` (default 30 s), so that on SIGINT/SIGTERM the API server
  gives the EngineCore time to write the final checkpoint before it kills it;
- in the API server process, the collector of DeltaServe's Prometheus metrics (:mod:`.metrics`), so they appear on
  vLLM's own ``/metrics``.

Optional settings next to ``job``: ``log_every_s`` (default 10), the interval of the fine-tuning progress line;
``shutdown_grace_s`` (default 30), the least ``--shutdown-timeout`` DeltaServe runs with.

Everything is checked before the engine starts: the job config is parsed (a bad one is refused with the field
and the fix), the vLLM version must be a supported one, and settings DeltaServe cannot run with (a different
``scheduler_cls``, tensor or pipeline parallelism, a LoRA rank below the job's) are refused with the reason.
The patch this applies is listed in docs/vllm-adapter.md.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

__all__ = ["DATA_PARALLEL_KEY", "DEFAULT_SHUTDOWN_GRACE_S", "JOBS_KEY", "configure_data_parallel",
           "configure_engine_args", "jobs_settings", "register"]

log = logging.getLogger("deltaserve.vllm")

_SCHEDULER = "deltaserve_vllm.scheduler.DeltaServeScheduler"
_ASYNC_SCHEDULER = "deltaserve_vllm.scheduler.AsyncDeltaServeScheduler"
_WORKER_EXTENSION = "deltaserve_vllm.worker.DeltaServeWorkerExtension"
_EXECUTOR = "deltaserve_vllm.serving.DeltaServeExecutor"
_MARK = "__deltaserve_wrapped__"
#: the least ``shutdown_timeout`` under DeltaServe: vLLM's API server force-kills the EngineCore this long after
#: it asks it to stop (at once with vLLM's default 0), and the final checkpoint is written in that window.
DEFAULT_SHUTDOWN_GRACE_S = 30
#: key next to ``job`` in ``--additional-config "deltaserve"`` that carries the engine's data parallelism (size and
#: the job's rendezvous) to every EngineCore: vLLM resets a dense model's EngineCores to data_parallel_size 1
DATA_PARALLEL_KEY = "data_parallel"
#: key next to ``job``: the settings of jobs created over HTTP (``data_dir``, ``dir``; deltaserve_core.job_create)
JOBS_KEY = "jobs"
#: how an operator turns creating jobs over HTTP on, named when a create is refused for the lack of it
HOW_TO_ENABLE_JOBS = ('start vLLM with --additional-config \'{"deltaserve": {"jobs": {"data_dir": "/data"}}}\' (with '
                      'or without "job"): training files are then read from inside that folder')


def jobs_settings(settings: dict[str, Any]) -> Any:
    """The ``jobs`` settings of ``--additional-config "deltaserve"`` (:class:`deltaserve_core.job_create.JobsSettings`;
    relative paths against this process's working directory). Raises ``ValueError`` naming the key."""
    from deltaserve_core.job_create import JobsSettings

    return JobsSettings.from_mapping(settings.get(JOBS_KEY), base=Path.cwd(),
                                     where='--additional-config "deltaserve".jobs', how_to_enable=HOW_TO_ENABLE_JOBS)


def register() -> None:
    """``vllm.general_plugins`` entry point: wrap ``EngineArgs.create_engine_config`` once per process."""
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:  # pragma: no cover - vLLM calls this, so it is importable
        return
    original = EngineArgs.create_engine_config
    if getattr(original, _MARK, False):
        return

    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        enabled = configure_engine_args(self)
        config = original(self, *args, **kwargs)
        if enabled:
            _match_scheduler_to_loop(config)
            configure_data_parallel(config)
        return config

    setattr(create_engine_config, _MARK, True)
    create_engine_config.__wrapped__ = original  # type: ignore[attr-defined]
    create_engine_config.__doc__ = original.__doc__
    EngineArgs.create_engine_config = create_engine_config  # type: ignore[method-assign]


def configure_engine_args(args: Any) -> bool:
    """Fill in DeltaServe's engine settings when ``args.additional_config`` has the ``deltaserve`` key.

    Returns whether DeltaServe is enabled. Raises ``ValueError`` (a setting DeltaServe cannot run with, a bad job
    config) or ``RuntimeError`` (an unsupported vLLM) before the engine starts."""
    from .channel import CONFIG_KEY, SERVE_KEY, SETTINGS_KEY

    extra = args.additional_config
    if not isinstance(extra, dict) or SETTINGS_KEY not in extra:
        return False
    settings = extra[SETTINGS_KEY]
    if not isinstance(settings, dict) or not (isinstance(settings.get("job"), str) or "jobs" in settings):
        raise ValueError('--additional-config "deltaserve" must be an object naming the fine-tuning job config, '
                         'e.g. \'{"deltaserve": {"job": "job.yaml"}}\', or the folder jobs created over HTTP read '
                         'their training files from, e.g. \'{"deltaserve": {"jobs": {"data_dir": "/data"}}}\'')
    if extra.get(CONFIG_KEY) not in (None, SERVE_KEY):
        return True  # an in-process VllmHost configured this engine itself

    from .serving import route_logs_to_vllm, startup_jobs
    from .versions import check_supported_vllm

    route_logs_to_vllm()
    check_supported_vllm()
    # paths absolute here: the EngineCore may run in another working directory
    if isinstance(settings.get("job"), str):
        settings["job"] = str(Path(settings["job"]).expanduser().resolve())
    settings[JOBS_KEY] = jobs_settings(settings).as_mapping()
    every_job = [j for j, _ in startup_jobs(settings)]  # refuses a bad config, naming the field and the fix
    job = every_job[-1] if every_job else None  # the newest, named in the start line
    for name, allowed in (("scheduler_cls", (_SCHEDULER, _ASYNC_SCHEDULER)),
                          ("worker_extension_cls", (_WORKER_EXTENSION,))):
        current = getattr(args, name)
        if current not in (None, "", *allowed):
            raise ValueError(f"DeltaServe needs {name}={allowed[0]}, but the engine was given {current!r}; "
                             f"drop --{name.replace('_', '-')} (DeltaServe sets it)")
    args.worker_extension_cls = _WORKER_EXTENSION
    from vllm.platforms import current_platform

    # vLLM settles async scheduling while it builds the config (on by default on CUDA; the CPU platform turns it
    # off); the class is paired with what it settles on afterwards (_match_scheduler_to_loop).
    args.scheduler_cls = _ASYNC_SCHEDULER if args.async_scheduling else _SCHEDULER
    if args.tensor_parallel_size != 1 or args.pipeline_parallel_size != 1:
        raise ValueError("DeltaServe on vLLM supports one worker per engine (tensor and pipeline parallel size 1); "
                         "run one engine per GPU (data parallel replicas) instead")
    backend = args.distributed_executor_backend
    if backend not in (None, "uni", _EXECUTOR):
        raise ValueError(f"DeltaServe runs vLLM's one-process executor; drop --distributed-executor-backend "
                         f"{backend!r}")
    args.distributed_executor_backend = _EXECUTOR
    if not args.enable_lora:
        log.info("DeltaServe: enabling LoRA (fine-tuning rows run on a reserved LoRA adapter)")
        args.enable_lora = True
    args.max_loras = int(args.max_loras) + 1
    log.info("DeltaServe: max_loras raised to %d (one slot is pinned to the fine-tuning adapter)", args.max_loras)
    from deltaserve_core.preflight import check_job

    for each in every_job:
        if each.lora.r > int(args.max_lora_rank):
            raise ValueError(f"job {each.adapter_name}'s LoRA rank {each.lora.r} exceeds --max-lora-rank "
                             f"{args.max_lora_rank}; start vLLM with --max-lora-rank {each.lora.r} (or more)")
        check_job(each, args.model)  # target modules against a local model folder, resume against the checkpoint
    # The model runner, torch.compile and CUDA graphs stay as the operator set them: the worker extension follows
    # both runners (runner_view), DeltaServe's executor installs the capture points before vLLM traces the model,
    # and steps with fine-tuning rows run without graphs (.layer_tap).
    grace = settings.get("shutdown_grace_s", DEFAULT_SHUTDOWN_GRACE_S)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 < grace <= 3600:
        raise ValueError(f'--additional-config "deltaserve": shutdown_grace_s must be a number of seconds in '
                         f'(0, 3600], got {grace!r}')
    if int(getattr(args, "shutdown_timeout", 0) or 0) < grace:
        # vLLM's default (0) aborts requests and kills the EngineCore at once: no final checkpoint. Drain mode
        # bounds in-flight requests and the checkpoint by one timeout the operator can see in the log.
        log.info("DeltaServe: shutdown_timeout raised from %s to %d s so the engine can write its final "
                 "checkpoint on SIGINT/SIGTERM", getattr(args, "shutdown_timeout", 0), math.ceil(grace))
        args.shutdown_timeout = math.ceil(grace)
    extra[CONFIG_KEY] = SERVE_KEY
    from deltaserve_core.hostkit import publish_dir

    from .guard import AdapterNamespace, install

    # Runtime LoRA loading stays as the operator set it (VLLM_ALLOW_RUNTIME_LORA_UPDATING): published versions
    # are served through the guard, in this process, and never through the public load endpoint.
    # every job the server starts with, so each one's versions are served by name (a job created later installs its
    # own: jobs_api)
    for started in every_job:
        install(AdapterNamespace(started.adapter_name, started.checkpoint.dir, publish_dir(started)))
    from .metrics import METRICS_FILE_KEY, install_api_server_collector

    # DeltaServe's metrics on this server's /metrics: the EngineCore writes what this process serves
    settings[METRICS_FILE_KEY] = install_api_server_collector()
    if job is not None:
        log.info("DeltaServe enabled: job %s (adapter %s)", settings.get("job") or "created over HTTP",
                 job.adapter_name)
    else:
        log.info("DeltaServe enabled without a job: POST /v1/fine_tuning/jobs creates one (training files from %s)",
                 settings[JOBS_KEY]["data_dir"])
    return True


def _match_scheduler_to_loop(config: Any) -> None:
    """Pair the scheduler class with the engine loop vLLM settled on (as vLLM pairs its own two schedulers)."""
    scheduler = config.scheduler_config
    scheduler.scheduler_cls = _ASYNC_SCHEDULER if scheduler.async_scheduling else _SCHEDULER


def configure_data_parallel(config: Any) -> None:
    """Under ``--data-parallel-size N`` > 1 every EngineCore runs one rank of the job: settle the job's
    ``data_parallel`` section against the engine (:func:`deltaserve_core.data_parallel.for_engine`: a different
    ``world_size`` is refused here, before any EngineCore starts) and hand size and rendezvous to the EngineCores.

    The rendezvous, when the job file leaves it out, is a free port on vLLM's data-parallel master address, chosen
    here, in the one process that starts every EngineCore; where this server does not start them all (several
    nodes, external load balancing) the job file must name it."""
    from deltaserve_core.data_parallel import for_engine, resolve_rank

    from .channel import SETTINGS_KEY
    from .serving import startup_job

    parallel = config.parallel_config
    if getattr(parallel, "_api_process_count", 1) > 1 and getattr(parallel, "_api_process_rank", -1) >= 0:
        return  # an API server the first process spawned after it settled this and started the EngineCores
    size = int(parallel.data_parallel_size)
    settings = config.additional_config[SETTINGS_KEY]
    job, _ = startup_job(settings)
    if size <= 1:
        settings.pop(DATA_PARALLEL_KEY, None)
        if job is not None and job.data_parallel.enabled:
            resolve_rank(job.data_parallel)  # one server of several: its rank and the rendezvous, refused here
        return
    if config.model_config.is_moe:
        # vLLM steps a mixture-of-experts model's DP engines in lockstep (dummy batches, collectives); DeltaServe's
        # fine-tuning-only steps on one rank were never run under that and could hold the others' collectives
        raise ValueError("DeltaServe with --data-parallel-size > 1 runs dense models only: vLLM steps a "
                         "mixture-of-experts model's data-parallel engines in lockstep, which fine-tuning steps on "
                         "one engine would break; run one `vllm serve` per replica (DELTASERVE_DP_RANK, "
                         "docs/scaling.md) or --data-parallel-size 1")
    if job is None:
        # no job to spread yet: each EngineCore learns it is one of several, so a create is refused there
        settings[DATA_PARALLEL_KEY] = {"world_size": size, "rendezvous": ""}
        return
    local = int(parallel.data_parallel_size_local or size)
    rendezvous = None
    if local == size and not getattr(parallel, "local_engines_only", False):
        from vllm.utils.network_utils import get_open_port

        host = parallel.data_parallel_master_ip or "127.0.0.1"
        rendezvous = f"[{host}]:{get_open_port()}" if ":" in host else f"{host}:{get_open_port()}"
    job = for_engine(job, size, rendezvous=rendezvous, flag="--data-parallel-size")
    settings[DATA_PARALLEL_KEY] = {"world_size": size, "rendezvous": job.data_parallel.rendezvous}
    log.info("DeltaServe: one fine-tuning job over the %d data-parallel engines (ranks 0..%d), their store at %s",
             size, size - 1, job.data_parallel.rendezvous)
