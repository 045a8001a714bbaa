"""SGLang's own server (``python -m sglang.launch_server``, ``sgl.Engine``) with DeltaServe: the operator path.

SGLang runs its scheduler in a subprocess and loads plugins there (``run_scheduler_process`` calls
``load_plugins()``), so DeltaServe attaches inside that process: the ``Scheduler.run_event_loop`` hook
(:mod:`.plugin`) finds :data:`ENV_JOB` in the environment (inherited from the launching shell), and before
SGLang's loop starts it builds :class:`ServeRuntime`: a :class:`ServeHost` over that very scheduler and the core's
:class:`~deltaserve_core.coserve.CoServer` for the job file. SGLang's own loop then drives everything: every loop
iteration offers its step to the core (an iteration with no client work is a fine-tuning-only step).

SGLang has no per-plugin configuration of its own (``SGLANG_PLUGINS`` only selects plugins), hence the environment
variable; without it the plugin passes every call straight through.

Latency model: the stored calibration profile of this host (same model path, dtype, device; the core's
``ProfileStore``, ``DELTASERVE_PROFILE_DIR``). When there is none, the scheduler is calibrated in place before
its loop starts (nothing else can step it then); the profile is stored, so the next start skips it.

Before anything loads, :func:`preflight` runs in the launching process (the ``prepare_server_args`` hook for
``sglang.launch_server``, right after SGLang's imports; the ``check_server_args`` hook for ``sgl.Engine``): the
job file, its dataset and checkpoint folder, the server arguments DeltaServe needs, the rank, the target modules
against the model's files and resuming against the checkpoint. A bad job stops SGLang there, before it spawns
the scheduler that would load the model.

Metrics: with SGLang's ``--enable-metrics`` every SGLang process runs prometheus_client in multiprocess mode, and
the API server's ``/metrics`` serves that folder; the job's metrics (:mod:`deltaserve_core.metrics`) are written
there from this process, beside SGLang's own scheduler metrics.

Stopping: SIGINT/SIGTERM reach the scheduler directly (Ctrl-C signals the whole process group), as SGLang's
``ShutdownReq`` once the API server drained its requests (SIGTERM to the API server), or as a SIGTERM from
:func:`stop_schedulers_first` just before the API server kills its children (SIGINT to the API server alone:
uvicorn stops and the launcher kills the process tree at once). Either way the scheduler's loop ends at its next
iteration (:meth:`ServeRuntime.begin_stop`), and :meth:`ServeRuntime.stop` writes the final checkpoint before
the process exits, within :func:`shutdown_grace_s`, for which the API server is made to wait.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.driver import HostConfig
from deltaserve_core.hostkit import published_name
from deltaserve_core.job_config import JobConfig
from deltaserve_core.job_create import CreatedJob, JobsSettings, startup_jobs
from deltaserve_core.runtime import EngineRuntime

from .host import SglangHost
from .versions import check_supported_sglang

__all__ = ["ENV_GRACE", "ENV_JOB", "ENV_JOBS_DATA_DIR", "ENV_JOBS_DIR", "ServeHost", "enabled",
           "jobs_settings", "ServeRuntime", "preflight", "server_args_problems",
           "shutdown_grace_s", "start_serving", "extend_scheduler_exit_timeout", "stop_schedulers_first"]

log = logging.getLogger("deltaserve.sglang")

#: Environment variable naming the job file (``deltaserve_core.job_config`` format) that enables DeltaServe.
ENV_JOB = "DELTASERVE_JOB"
#: Seconds a stop may take to write the final checkpoint (default :data:`DEFAULT_GRACE_S`); the API server waits
#: this long for the scheduler after it asked it to stop, instead of SGLang's 15 s.
ENV_GRACE = "DELTASERVE_SHUTDOWN_GRACE_S"
DEFAULT_GRACE_S = 30.0
#: The folder jobs created over HTTP (``POST /v1/fine_tuning/jobs``) read their training files from; set, it enables
#: DeltaServe with or without :data:`ENV_JOB`.
ENV_JOBS_DATA_DIR = "DELTASERVE_JOBS_DATA_DIR"
#: Where created jobs are kept (default ``deltaserve-jobs`` in the launching directory), so a restart resumes them.
ENV_JOBS_DIR = "DELTASERVE_JOBS_DIR"
#: How many fine-tuning jobs may be active at once (default 1), the job file's included; a create past it is 409.
ENV_JOBS_MAX_CONCURRENT = "DELTASERVE_JOBS_MAX_CONCURRENT"
_JOBS_ENV = (("data_dir", ENV_JOBS_DATA_DIR), ("dir", ENV_JOBS_DIR), ("max_concurrent", ENV_JOBS_MAX_CONCURRENT))
_HOW_TO_ENABLE_JOBS = (f"start SGLang with {ENV_JOBS_DATA_DIR}=/data in its environment (with or without {ENV_JOB}): "
                       "training files are then read from inside that folder")


def enabled() -> bool:
    """Whether the environment turns DeltaServe on: a job file, or a data folder for jobs created over HTTP."""
    return bool(os.environ.get(ENV_JOB) or os.environ.get(ENV_JOBS_DATA_DIR))


def jobs_settings() -> JobsSettings:
    """The settings of jobs created over HTTP, from :data:`ENV_JOBS_DATA_DIR`, :data:`ENV_JOBS_DIR` and
    :data:`ENV_JOBS_MAX_CONCURRENT` (relative paths against the working directory; the scheduler inherits the
    launcher's). Raises ``ValueError`` naming the variable."""
    raw = {key: os.environ[env] for key, env in _JOBS_ENV if os.environ.get(env)}
    try:
        return JobsSettings.from_mapping(raw, base=Path.cwd(), where="the jobs settings",
                                         how_to_enable=_HOW_TO_ENABLE_JOBS, limit_setting=ENV_JOBS_MAX_CONCURRENT)
    except ValueError as exc:
        message = str(exc)
        for key, env in _JOBS_ENV:
            message = message.replace(f"the jobs settings.{key}", env)
        raise ValueError(message) from None


def _startup_jobs() -> list[tuple[JobConfig, CreatedJob | None]]:
    jobs = jobs_settings()
    return startup_jobs(os.environ.get(ENV_JOB) or None, jobs if jobs.data_dir is not None else None)


def shutdown_grace_s() -> float:
    """:data:`ENV_GRACE` as a number of seconds in (0, 3600]; raises ``ValueError`` naming it otherwise."""
    raw = os.environ.get(ENV_GRACE, "").strip()
    if not raw:
        return DEFAULT_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 3600:  # also refuses nan and inf
        raise ValueError(f"{ENV_GRACE}={raw!r}: must be a number of seconds in (0, 3600], e.g. {ENV_GRACE}=30")
    return value


def server_args_problems(server_args: Any, *, overlap: bool | None = None) -> list[str]:
    """What DeltaServe needs of SGLang's arguments and ``server_args`` lacks, each naming the flag.

    ``overlap``: whether the scheduler runs the overlap loop; ``None`` before the scheduler exists, where it is
    not checked (SGLang settles it while it resolves its arguments, and the scheduler checks it then).
    Before resolution ``enable_lora`` may be unset with ``--lora-paths`` given, which turns LoRA on."""
    sa = server_args
    problems = []
    if not (sa.enable_lora or (overlap is None and getattr(sa, "lora_paths", None))):
        problems.append("--enable-lora (fine-tuning rows run on a reserved LoRA adapter)")
    if overlap:
        problems.append("--disable-overlap-schedule (a step's record is built from its own result)")
    if tuple(getattr(sa, k, 1) or 1 for k in ("tp_size", "pp_size", "dp_size")) != (1, 1, 1):
        problems.append("tp/pp/dp size 1 (one scheduler process)")
    if getattr(sa, "speculative_algorithm", None):
        problems.append("no speculative decoding")
    return problems


def _lora_target_problems(job: JobConfig, server_args: Any) -> list[str]:
    # SGLang builds LoRA layers only for --lora-target-modules: the reserved adapter would fail to load (after
    # the model did) with a target outside them.
    allowed = getattr(server_args, "lora_target_modules", None)
    if not allowed or "all" in allowed:
        return []
    missing = sorted(set(job.lora.target_modules) - set(allowed))
    if not missing:
        return []
    wider = " ".join(sorted(set(allowed) | set(missing)))
    return [f"lora.target_modules: {missing} are not among SGLang's --lora-target-modules {sorted(allowed)}; drop "
            f"them from the job or start SGLang with --lora-target-modules {wider}"]


def preflight(server_args: Any) -> JobConfig | None:
    """Check the job the server starts with (:data:`ENV_JOB`'s, or the newest created over HTTP) against
    ``server_args`` before SGLang spawns its scheduler.

    Raises :class:`~deltaserve_core.job_config.JobConfigError` (or ``ValueError`` for the checkpoint folder and
    the server arguments), naming the key or flag, the value and the fix; ``None`` when no job is set (with
    :data:`ENV_JOBS_DATA_DIR` set, the server arguments are checked all the same). Reads only files: the job, the
    model's safetensors headers and config, the checkpoint folder's JSON."""
    if not enabled():
        return None
    job_path = os.environ.get(ENV_JOB) or os.environ.get(ENV_JOBS_DATA_DIR, "")
    from deltaserve_core.job_config import JobConfigError
    from deltaserve_core.preflight import check_job, check_local_files

    try:
        every_job = [j for j, _ in _startup_jobs()]
        problems = server_args_problems(server_args)
        if problems:
            raise ValueError("DeltaServe needs SGLang started with " + "; ".join(problems))
        shutdown_grace_s()
        if not every_job:
            _LAUNCHER["job"] = job_path
            return None
        for job in every_job:
            check_local_files(job)
            problems = _lora_target_problems(job, server_args)
            if problems:
                raise JobConfigError(f"job config: {problems[0]}")
            rank = getattr(server_args, "max_lora_rank", None)
            check_job(job, str(server_args.model_path), max_lora_rank=int(rank) if rank else None,
                      how_to_raise_rank=f"or start SGLang with --max-lora-rank {job.lora.r}")
        job = every_job[0]
    except ValueError as exc:
        # the traceback SGLang prints next ends in this message too; this line is the one to read
        log.error("DeltaServe refuses to start (%s=%s): %s", ENV_JOB, job_path, exc)
        raise
    if not (getattr(server_args, "api_key", None) or getattr(server_args, "admin_api_key", None)) \
            and _LAUNCHER.get("job") != job_path:  # once, though both launcher hooks call this
        log.warning("DeltaServe: SGLang runs without --api-key/--admin-api-key, so any client that reaches the "
                    "port can call /load_lora_adapter and load DeltaServe's checkpoint folders by path; set a key "
                    "(docs/security.md)")
    _LAUNCHER["job"] = job_path
    return job


#: set in the launching process once :func:`preflight` accepted a job: :func:`stop_schedulers_first` acts there
_LAUNCHER: dict[str, str] = {}


def stop_schedulers_first(parent_pid: int | None) -> None:
    """Called just before SGLang's ``kill_process_tree`` (SIGKILL to every child) in the launching process:
    SIGTERM the scheduler processes and wait, at most :func:`shutdown_grace_s`, until they exited.

    Each scheduler then leaves its loop and writes the final checkpoint. Does nothing in other processes, for
    other trees, when no job runs, or when the schedulers are already gone (the SIGTERM path waited for them)."""
    if not _LAUNCHER.get("job") or parent_pid not in (None, os.getpid()):
        return
    del _LAUNCHER["job"]  # once: a later kill (a crash handler) must not wait again
    import psutil
    from sglang.srt.utils.cudacore_pyspy_dump_utils import collect_scheduler_processes

    alive = []
    for proc in collect_scheduler_processes():
        try:
            proc.send_signal(signal.SIGTERM)
            alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    if not alive:
        return
    grace = shutdown_grace_s()
    log.info("DeltaServe: waiting up to %.0f s for %d scheduler process(es) to write the final checkpoint",
             grace, len(alive))
    _, still = psutil.wait_procs(alive, timeout=grace)
    if still:
        log.error("DeltaServe: scheduler process(es) %s did not exit within %.0f s; SGLang kills them now and "
                  "the training since the last checkpoint is lost", [p.pid for p in still], grace)


class ServeHost(SglangHost):
    """:class:`~deltaserve_core.hooks.HostHooks` over the scheduler of a running SGLang server."""

    def __init__(self, scheduler: Any, publish_root: Path | None) -> None:
        from . import plugin

        version = check_supported_sglang()
        plugin.verify_hooks()
        sa = scheduler.server_args
        problems = server_args_problems(sa, overlap=bool(getattr(scheduler, "enable_overlap", False)))
        if problems:
            raise RuntimeError("DeltaServe needs SGLang started with " + "; ".join(problems))
        dtype = str(scheduler.model_config.dtype).removeprefix("torch.")
        budget = min(x for x in (sa.chunked_prefill_size, sa.max_prefill_tokens) if x and x > 0)
        config = HostConfig(model=str(sa.model_path), dtype=dtype, device=str(sa.device), seed=sa.random_seed or 0,
                            max_lora_rank=int(sa.max_lora_rank or 16), max_batch_tokens=int(budget),
                            max_running_requests=int(scheduler.max_running_requests))
        self._publish_root = publish_root
        self._attach(scheduler, config, version)

    def publish_to(self, publish_root: Path) -> None:
        """Publish into ``publish_root`` from now on (a created job's folder)."""
        self._publish_root = publish_root

    def publish_adapter(self, state: LoraAdapterState) -> str:
        if self._publish_root is None:
            raise RuntimeError("no fine-tuning job runs on this engine: nothing to publish")
        # The API server resolves adapter names in its own process (TokenizerManager), so a version loaded here
        # only would not be addressable: it is written to a fresh folder per version for the operator to load
        # with SGLang's /load_lora_adapter endpoint (a new name per version, so no stale KV is served under it).
        self._check_rank(state)
        name = published_name(state.name, state.version)
        path = self._publish_root / name
        state.save_pretrained(path)
        log.info("published adapter %s at %s: POST /load_lora_adapter {\"lora_name\": %r, \"lora_path\": %r}",
                 name, path, name, str(path))
        return name

    def retract_adapter(self, name: str) -> None:
        # The operator loaded the version into the API server (publish_adapter's log line); only that server can
        # withdraw it, since it resolves names in its own process.
        log.info("retracted adapter %s: POST /unload_lora_adapter {\"lora_name\": %r} to stop serving it", name, name)


class ServeRuntime(EngineRuntime):
    """The CoServer of one SGLang scheduler process."""

    def __init__(self, scheduler: Any) -> None:
        sa = scheduler.server_args
        super().__init__(None, engine="sglang", grace_s=shutdown_grace_s(), where="the SGLang scheduler",
                         jobs=jobs_settings(), startup=_startup_jobs(),
                         served_models=tuple(dict.fromkeys(str(n) for n in (
                             getattr(sa, "served_model_name", None), sa.model_path) if n)))
        self.scheduler = scheduler
        self.serve_host = ServeHost(scheduler, self.publish_root)
        for job, _ in self._startup:
            # before the backward starts: it would otherwise die on a tensor-size mismatch or train nothing
            self.preflight_job(job)

    def preflight_job(self, job: JobConfig) -> None:
        from deltaserve_core.job_config import JobConfigError
        from deltaserve_core.preflight import check_job

        problems = _lora_target_problems(job, self.scheduler.server_args)
        if problems:
            raise JobConfigError(f"job config: {problems[0]}")
        check_job(job, self.serve_host.config.model, max_lora_rank=self.serve_host.config.max_lora_rank,
                  how_to_raise_rank=f"or start SGLang with --max-lora-rank {job.lora.r}")

    def start(self) -> None:  # type: ignore[override]
        scheduler, host = self.scheduler, self.serve_host
        # Calibration in place works now, before SGLang's loop owns the steps. Shapes bounded by what this server
        # admits: one request's input (SGLang aborts longer ones) and its request slots; calibration's defaults
        # assume a long-context model.
        longest = int(scheduler.max_req_input_len) - 2
        super().start(host, calibration={
            "max_prefill_tokens": min(host.config.max_batch_tokens, longest),
            "max_kv": min(int(scheduler.max_total_num_tokens) // 2, longest),
            "max_decode_batch": min(64, int(scheduler.max_running_requests))})
        if self.metrics is None and self.job is not None:
            log.info("DeltaServe: SGLang runs without --enable-metrics, so its /metrics (and DeltaServe's metrics "
                     "on it) is off")
        # the loop ends at its next iteration through SGLang's own ShutdownReq flag
        self.on_begin_stop(lambda: setattr(self.scheduler, "gracefully_exit", True))
        self.on_stop(host.shutdown)
        self.catch_stop_signals(chain=False)


def start_serving(scheduler: Any) -> ServeRuntime | None:
    """Called by the ``run_event_loop`` hook: the runtime when DeltaServe is enabled (:func:`enabled`), else None."""
    if not enabled():
        return None
    runtime = ServeRuntime(scheduler)
    runtime.start()
    from .jobs_api import serve_job_calls

    serve_job_calls(scheduler, runtime)  # the /v1/fine_tuning/jobs calls of the API server (jobs_api)
    return runtime


def extend_scheduler_exit_timeout() -> None:
    """In the API server process: wait :func:`shutdown_grace_s` for the scheduler after asking it to stop.

    SGLang's API server drains its requests, sends the scheduler a ``ShutdownReq`` and kills it 15 s later
    (``tokenizer_manager._SCHEDULER_EXIT_TIMEOUT_SECS``); a backward batch plus the final checkpoint may need
    longer on a busy machine. The wait ends as soon as the scheduler exits."""
    from sglang.srt.managers import tokenizer_manager

    grace = shutdown_grace_s()
    current = getattr(tokenizer_manager, "_SCHEDULER_EXIT_TIMEOUT_SECS", None)
    if isinstance(current, (int, float)) and current < grace:
        tokenizer_manager._SCHEDULER_EXIT_TIMEOUT_SECS = grace
