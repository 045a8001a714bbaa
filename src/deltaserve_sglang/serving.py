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
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.driver import HostConfig
from deltaserve_core.job_config import JobConfig

from .host import SglangHost
from .versions import check_supported_sglang

__all__ = ["ENV_JOB", "ServeHost", "ServeRuntime", "published_dir", "start_serving"]

log = logging.getLogger("deltaserve.sglang")

#: Environment variable naming the job file (``deltaserve_core.job_config`` format) that enables DeltaServe.
ENV_JOB = "DELTASERVE_JOB"


def published_dir(job: JobConfig) -> Path:
    """Where published adapter versions are written (beside the job's checkpoints)."""
    return Path(job.checkpoint.dir).parent / "published"


class ServeHost(SglangHost):
    """:class:`~deltaserve_core.hooks.HostHooks` over the scheduler of a running SGLang server."""

    def __init__(self, scheduler: Any, publish_root: Path) -> None:
        from . import plugin

        version = check_supported_sglang()
        plugin.verify_hooks()
        sa = scheduler.server_args
        problems = []
        if not sa.enable_lora:
            problems.append("--enable-lora (fine-tuning rows run on a reserved LoRA adapter)")
        if getattr(scheduler, "enable_overlap", False):
            problems.append("--disable-overlap-schedule (a step's record is built from its own result)")
        if tuple(getattr(sa, k, 1) or 1 for k in ("tp_size", "pp_size", "dp_size")) != (1, 1, 1):
            problems.append("tp/pp/dp size 1 (one scheduler process)")
        if getattr(sa, "speculative_algorithm", None):
            problems.append("no speculative decoding")
        if problems:
            raise RuntimeError("DeltaServe needs SGLang started with " + "; ".join(problems))
        dtype = str(scheduler.model_config.dtype).removeprefix("torch.")
        budget = min(x for x in (sa.chunked_prefill_size, sa.max_prefill_tokens) if x and x > 0)
        config = HostConfig(model=str(sa.model_path), dtype=dtype, device=str(sa.device), seed=sa.random_seed or 0,
                            max_lora_rank=int(sa.max_lora_rank or 16), max_batch_tokens=int(budget),
                            max_running_requests=int(scheduler.max_running_requests))
        self._publish_root = publish_root
        self._attach(scheduler, config, version)

    def publish_adapter(self, state: LoraAdapterState) -> str:
        # The API server resolves adapter names in its own process (TokenizerManager), so a version loaded here
        # only would not be addressable: it is written to a fresh folder per version for the operator to load
        # with SGLang's /load_lora_adapter endpoint (a new name per version, so no stale KV is served under it).
        self._check_rank(state)
        name = f"{state.name}@v{state.version}"
        path = self._publish_root / name
        state.save_pretrained(path)
        log.info("published adapter %s at %s: POST /load_lora_adapter {\"lora_name\": %r, \"lora_path\": %r}",
                 name, path, name, str(path))
        return name


class ServeRuntime:
    """The CoServer of one SGLang scheduler process."""

    def __init__(self, scheduler: Any, job_path: str) -> None:
        from deltaserve_core.coserve import CoServer
        from deltaserve_core.job_config import load_job_config

        self.job = load_job_config(job_path)
        publish_root = published_dir(self.job)
        publish_root.mkdir(parents=True, exist_ok=True)
        self.host = ServeHost(scheduler, publish_root)
        from deltaserve_core.preflight import check_job

        # before the backward starts: it would otherwise die on a tensor-size mismatch or train nothing
        check_job(self.job, self.host.config.model, max_lora_rank=self.host.config.max_lora_rank,
                  how_to_raise_rank=f"or start SGLang with --max-lora-rank {self.job.lora.r}")
        # No latency model passed: CoServer.start() loads the stored profile or calibrates this scheduler, which
        # only works now, before SGLang's loop owns the steps.
        # Shapes bounded by what this server admits: one request's input (SGLang aborts longer ones) and its
        # request slots; calibration's defaults assume a long-context model.
        longest = int(scheduler.max_req_input_len) - 2
        self.coserver = CoServer(self.host, self.job, calibration={
            "progress": False, "max_prefill_tokens": min(self.host.config.max_batch_tokens, longest),
            "max_kv": min(int(scheduler.max_total_num_tokens) // 2, longest),
            "max_decode_batch": min(64, int(scheduler.max_running_requests))})
        self._stopped = False

    def start(self) -> None:
        self.coserver.start()
        log.info("DeltaServe co-serving started in the SGLang scheduler: dataset %s, adapter %s, checkpoints in %s",
                 self.job.dataset, self.job.adapter_name, self.job.checkpoint.dir)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            self.coserver.shutdown()
        finally:
            self.host.shutdown()


def start_serving(scheduler: Any) -> ServeRuntime | None:
    """Called by the ``run_event_loop`` hook: the runtime when :data:`ENV_JOB` is set, else None."""
    job = os.environ.get(ENV_JOB)
    if not job:
        return None
    runtime = ServeRuntime(scheduler, job)
    runtime.start()
    return runtime
