"""The fine-tuning jobs API inside vLLM's own OpenAI server: ``/v1/fine_tuning/jobs``.

A ``vllm.endpoint_plugins`` entry point (vLLM's official extension point for HTTP routes, see
``vllm/plugins/endpoint_plugins/interface.py``; nothing of vLLM is patched). vLLM loads an endpoint plugin only
when ``VLLM_PLUGINS`` names it, and ``VLLM_PLUGINS`` gates the general plugins too, so an operator turns this on
with ``VLLM_PLUGINS=deltaserve,deltaserve_jobs`` (the engine side, :mod:`.plugin`, is ``deltaserve``).

Routes (OpenAI's shapes; DeltaServe's own fields under each job's ``deltaserve`` key)::

    GET  /v1/fine_tuning/jobs                       list (``data``, ``has_more``)
    POST /v1/fine_tuning/jobs                       refused (501): this server runs the job declared at start-up
    GET  /v1/fine_tuning/jobs/{id}                  one job (``fine_tuning.job``)
    POST /v1/fine_tuning/jobs/{id}/pause|resume|cancel
    GET  /v1/fine_tuning/jobs/{id}/events?after=&limit=       newest first, paged
    GET  /v1/fine_tuning/jobs/{id}/checkpoints?after=&limit=  newest first, paged

They are under ``/v1``, so vLLM's ``--api-key`` (or ``VLLM_API_KEY``) middleware guards them like the completions.
The job lives in the EngineCore process; each call is one ``collective_rpc`` of the worker's
``deltaserve_job_call`` (:mod:`.worker`), which runs between two engine steps.
"""

from __future__ import annotations

import json
import logging
import os
from argparse import Namespace
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

__all__ = ["JOBS_PLUGIN_NAME", "JobsApiPlugin"]

log = logging.getLogger("deltaserve.vllm")

#: the name ``VLLM_PLUGINS`` must list for these routes to exist
JOBS_PLUGIN_NAME = "deltaserve_jobs"
#: an engine busy with a long step answers between steps; past this the call is reported as failed
_RPC_TIMEOUT_S = 60.0
_PREFIX = "/v1/fine_tuning/jobs"
CREATE_REFUSAL = ("this server runs the fine-tuning job declared when it started (vllm serve ... "
                  "--additional-config '{\"deltaserve\": {\"job\": \"job.yaml\"}}'); creating a job over HTTP comes "
                  "with several jobs per server, which DeltaServe does not support yet. Restart the server with the "
                  "new job config, or list the running job with GET /v1/fine_tuning/jobs")


def _error(status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
           param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type, "param": param, "code": code}},
                        status_code=status)


def _deltaserve_enabled(args: Namespace | None) -> bool:
    extra = getattr(args, "additional_config", None)
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except json.JSONDecodeError:
            return False
    return isinstance(extra, dict) and "deltaserve" in extra


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
            log.warning("DeltaServe jobs API loaded, but this server runs no DeltaServe job (start it with "
                        "--additional-config '{\"deltaserve\": {\"job\": \"job.yaml\"}}'): its routes answer 404")
        elif not (getattr(args, "api_key", None) or os.environ.get("VLLM_API_KEY")):
            # vLLM's key is the only guard of these routes; without one, whoever reaches the port can cancel the job
            log.warning("DeltaServe jobs API without an API key: anyone who can reach this server can pause or cancel "
                        "the fine-tuning job; start vLLM with --api-key or VLLM_API_KEY (docs/security.md)")

    async def _call(self, op: str, **args: Any) -> Any:
        """The engine's answer to one job call, or the OpenAI error response to send instead."""
        if not self._enabled:
            return _error(404, "no DeltaServe fine-tuning job runs on this server: start vLLM with --additional-config "
                          "'{\"deltaserve\": {\"job\": \"job.yaml\"}}'", code="deltaserve_not_enabled")
        try:
            answers = await self._engine.collective_rpc("deltaserve_job_call", timeout=_RPC_TIMEOUT_S,
                                                        args=(op, args))
        except Exception as exc:  # noqa: BLE001 - a dead or stuck engine is the client's 503, not a traceback
            log.warning("DeltaServe jobs API: %s failed in the engine: %s", op, exc)
            return _error(503, f"the engine did not answer the job call {op!r}: {exc}", type="service_unavailable",
                          code="engine_unavailable")
        answer = answers[0] if isinstance(answers, list) else answers
        if "error" in answer:
            error = answer["error"]
            return _error(int(answer.get("status", 500)), error.get("message", "job call failed"),
                          type=error.get("type", "invalid_request_error"), code=error.get("code"),
                          param=error.get("param"))
        return answer["result"]

    async def _list(self, op: str, request: Request, **args: Any) -> Any:
        query = request.query_params
        result = await self._call(op, after=query.get("after"), limit=query.get("limit"), **args)
        if isinstance(result, JSONResponse):
            return result
        return JSONResponse({"object": "list", **result})

    def _control_route(self, op: str) -> Any:
        # a function per operation: FastAPI reads a route's parameters from its signature, so `op` cannot be one
        async def route(job_id: str) -> Any:
            return _json(await self._call(op, id=job_id))

        return route

    def attach_router(self, app: FastAPI) -> None:
        router = APIRouter()

        @router.get(_PREFIX)
        async def list_jobs(request: Request) -> Any:
            result = await self._call("list")
            if isinstance(result, JSONResponse):
                return result
            after, limit = request.query_params.get("after"), request.query_params.get("limit")
            ids = [job["id"] for job in result]
            start = ids.index(after) + 1 if after in ids else 0
            try:
                count = int(limit) if limit is not None else 20
            except ValueError:
                return _error(400, f"'limit' must be an integer, got {limit!r}", param="limit", code="invalid_limit")
            page = result[start:start + max(count, 0)]
            return JSONResponse({"object": "list", "data": page, "has_more": start + len(page) < len(result)})

        @router.post(_PREFIX)
        async def create_job() -> Any:
            return _error(501, CREATE_REFUSAL, code="jobs_declared_at_startup")

        @router.get(_PREFIX + "/{job_id}")
        async def get_job(job_id: str) -> Any:
            return _json(await self._call("get", id=job_id))

        for op in ("pause", "resume", "cancel"):
            router.add_api_route(f"{_PREFIX}/{{job_id}}/{op}", self._control_route(op), methods=["POST"],
                                 name=f"{op}_fine_tuning_job")

        @router.get(_PREFIX + "/{job_id}/events")
        async def job_events(job_id: str, request: Request) -> Any:
            return await self._list("events", request, id=job_id)

        @router.get(_PREFIX + "/{job_id}/checkpoints")
        async def job_checkpoints(job_id: str, request: Request) -> Any:
            return await self._list("checkpoints", request, id=job_id)

        app.include_router(router)


def _json(result: Any) -> Any:
    return result if isinstance(result, JSONResponse) else JSONResponse(result)
