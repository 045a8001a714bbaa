"""The fine-tuning jobs API inside vLLM's own OpenAI server: ``/v1/fine_tuning/jobs``.

A ``vllm.endpoint_plugins`` entry point (vLLM's official extension point for HTTP routes, see
``vllm/plugins/endpoint_plugins/interface.py``; nothing of vLLM is patched). vLLM loads an endpoint plugin only
when ``VLLM_PLUGINS`` names it, and ``VLLM_PLUGINS`` gates the general plugins too, so an operator turns this on
with ``VLLM_PLUGINS=deltaserve,deltaserve_jobs`` (the engine side, :mod:`.plugin`, is ``deltaserve``).

Routes (OpenAI's shapes; DeltaServe's own fields under each job's ``deltaserve`` key)::

    GET  /v1/fine_tuning/jobs                       list (``data``, ``has_more``)
    POST /v1/fine_tuning/jobs                       create (beside running jobs, up to jobs.max_concurrent;
                                                    not under data parallelism)
    GET  /v1/fine_tuning/jobs/{id}                  one job (``fine_tuning.job``)
    POST /v1/fine_tuning/jobs/{id}/pause|resume|cancel
    GET  /v1/fine_tuning/jobs/{id}/events?after=&limit=       newest first, paged
    GET  /v1/fine_tuning/jobs/{id}/checkpoints?after=&limit=  newest first, paged

They are under ``/v1``, so vLLM's ``--api-key`` (or ``VLLM_API_KEY``) middleware guards them like the completions.
The job lives in the EngineCore process; each call is one ``collective_rpc`` of the worker's
``deltaserve_job_call`` (:mod:`.worker`), which runs between two engine steps. Under ``--data-parallel-size N``
every EngineCore runs one rank of the job: a call goes to each of them and their answers are merged
(:func:`deltaserve_core.job_control.merge_rank_answers`: per-rank and total progress). Routes and JSON shapes are the
core's (:mod:`deltaserve_core.jobs_routes`), shared with the SGLang adapter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from argparse import Namespace
from typing import Any

from fastapi import FastAPI

from deltaserve_core.job_control import merge_rank_answers
from deltaserve_core.jobs_routes import build_jobs_router, error_answer

__all__ = ["JOBS_PLUGIN_NAME", "JobsApiPlugin"]

log = logging.getLogger("deltaserve.vllm")

#: the name ``VLLM_PLUGINS`` must list for these routes to exist
JOBS_PLUGIN_NAME = "deltaserve_jobs"
#: an engine busy with a long step answers between steps; past this the call is reported as failed
_RPC_TIMEOUT_S = 60.0


def _deltaserve_enabled(args: Namespace | None) -> bool:
    extra = getattr(args, "additional_config", None)
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except json.JSONDecodeError:
            return False
    return isinstance(extra, dict) and "deltaserve" in extra


def _engines(engine_client: Any) -> tuple[Any, list[Any]] | None:
    """The engine-core client and its engines' identities when this server's client talks to several engines
    (``--data-parallel-size`` > 1), else None. ``core_engines`` and ``_call_utility_async`` are the client's own
    members in 0.32 and (read, not run) 0.26."""
    core = getattr(engine_client, "engine_core", None)
    identities = list(getattr(core, "core_engines", None) or ())
    if len(identities) < 2 or not callable(getattr(core, "_call_utility_async", None)):
        return None
    return core, identities


class JobsApiPlugin:
    """``vllm.endpoint_plugins`` factory: the jobs routes on the app, the engine client kept for them."""

    name = JOBS_PLUGIN_NAME
    required_tasks = ("generate",)  # the job lives in a generating engine; the render-only server has none

    def __init__(self) -> None:
        self._engine: Any = None
        self._enabled = False

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        self._engine = engine_client
        self._enabled = engine_client is not None and _deltaserve_enabled(args)
        if not self._enabled:
            log.warning("DeltaServe jobs API loaded, but DeltaServe is not enabled on this server (start it with "
                        "--additional-config '{\"deltaserve\": {\"job\": \"job.yaml\"}}' or "
                        "'{\"deltaserve\": {\"jobs\": {\"data_dir\": \"/data\"}}}'): its routes answer 404")
        elif not (getattr(args, "api_key", None) or os.environ.get("VLLM_API_KEY")):
            # vLLM's key is the only guard of these routes; without one, whoever reaches the port can cancel the job
            log.warning("DeltaServe jobs API without an API key: anyone who can reach this server can pause or cancel "
                        "the fine-tuning job; start vLLM with --api-key or VLLM_API_KEY (docs/security.md)")

    async def _call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """The engine's answer to one job call (raises when the engine does not answer: the router's 503)."""
        if not self._enabled:
            return error_answer(404, "no DeltaServe fine-tuning job runs on this server: start vLLM with "
                                "--additional-config '{\"deltaserve\": {\"job\": \"job.yaml\"}}'",
                                code="deltaserve_not_enabled")
        engines = _engines(self._engine)
        if engines is None:
            answers = await self._engine.collective_rpc("deltaserve_job_call", timeout=_RPC_TIMEOUT_S, args=(op, args))
            return answers[0] if isinstance(answers, list) else answers
        # vLLM's own collective_rpc answers with the first engine's result only (it sends to every engine under
        # data parallelism): ask each engine, so the job's answer covers every rank
        core, identities = engines
        per_engine = await asyncio.gather(*[
            core._call_utility_async("collective_rpc", "deltaserve_job_call", _RPC_TIMEOUT_S, (op, args), None,
                                     engine=identity) for identity in identities])
        return merge_rank_answers(op, [a[0] if isinstance(a, list) else a for a in per_engine])

    def attach_router(self, app: FastAPI) -> None:
        app.include_router(build_jobs_router(self._call, on_created=_serve_published_versions))


def _serve_published_versions(job: dict[str, Any]) -> None:
    """A created job's published versions are served by name from this process, beside every other job's
    (:mod:`.guard`); the create's answer names its folders before it has published anything."""
    from .guard import AdapterNamespace, install

    ds = job["deltaserve"]
    install(AdapterNamespace(ds["adapter_name"], ds["checkpoint"]["dir"], ds["publish"]["dir"]))
