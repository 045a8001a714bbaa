"""The HTTP routes of the fine-tuning jobs API, shared by every engine adapter that serves it.

Engine-agnostic: an adapter passes a :data:`JobCaller` (an awaitable that runs :func:`~deltaserve_core.job_control.
job_call` in the process that owns the job, over whatever channel that engine has) and mounts the router this
module builds on its engine's FastAPI app. Routing, paging of the job list, the JSON shapes and the error objects
live here, so ``vllm serve`` and ``sglang.launch_server`` answer alike. Needs FastAPI, which every engine whose
server mounts these routes brings; the core does not depend on it, and only the adapters import this module.

Routes (OpenAI's shapes; DeltaServe's own fields under each job's ``deltaserve`` key)::

    GET  /v1/fine_tuning/jobs                       list (``data``, ``has_more``)
    POST /v1/fine_tuning/jobs                       create (deltaserve_core.job_create), up to jobs.max_concurrent
    GET  /v1/fine_tuning/jobs/{id}                  one job (``fine_tuning.job``)
    POST /v1/fine_tuning/jobs/{id}/pause|resume|cancel
    GET  /v1/fine_tuning/jobs/{id}/events?after=&limit=       newest first, paged
    GET  /v1/fine_tuning/jobs/{id}/checkpoints?after=&limit=  newest first, paged
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

__all__ = ["CONTROL_OPS", "JOBS_PREFIX", "JobCaller", "build_jobs_router", "error_answer", "error_response"]

log = logging.getLogger("deltaserve.jobs")

JOBS_PREFIX = "/v1/fine_tuning/jobs"
#: the calls that change the job (an adapter may guard them more strictly than the reads)
CONTROL_OPS = ("pause", "resume", "cancel")

#: ``(op, args) -> job_call's answer``: ``{"result": ...}`` or ``{"status": N, "error": {...}}``; raising means
#: the engine did not answer (the client gets 503)
JobCaller = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
#: ``(op, endpoint) -> endpoint``: lets an adapter tag endpoints for its engine's auth middleware
EndpointMarker = Callable[[str, Callable[..., Any]], Callable[..., Any]]


def error_answer(status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> dict[str, Any]:
    """An error in :func:`~deltaserve_core.job_control.job_call`'s answer shape, for adapters that refuse a call
    before it reaches the engine."""
    return {"status": status, "error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                   param: str | None = None) -> JSONResponse:
    """OpenAI's error object as an HTTP response."""
    return JSONResponse({"error": {"message": message, "type": type, "param": param, "code": code}},
                        status_code=status)


def build_jobs_router(call: JobCaller, *, mark: EndpointMarker | None = None,
                      on_created: Callable[[dict[str, Any]], None] | None = None) -> APIRouter:
    """The jobs routes over ``call``; ``on_created``: run in the API server with the job a create started (an
    adapter that serves the job's published versions from this process learns the new job's names there)."""

    async def answer(op: str, **args: Any) -> Any:
        """The call's result, or the error response to send instead."""
        try:
            reply = await call(op, args)
        except Exception as exc:  # noqa: BLE001 - a dead or stuck engine is the client's 503, not a traceback
            log.warning("DeltaServe jobs API: %s failed in the engine: %s", op, exc)
            return error_response(503, f"the engine did not answer the job call {op!r}: {exc}",
                                  type="service_unavailable", code="engine_unavailable")
        if "error" in reply:
            error = reply["error"]
            return error_response(int(reply.get("status", 500)), error.get("message", "job call failed"),
                                  type=error.get("type", "invalid_request_error"), code=error.get("code"),
                                  param=error.get("param"))
        return reply["result"]

    def as_json(result: Any) -> Any:
        return result if isinstance(result, JSONResponse) else JSONResponse(result)

    async def paged(op: str, request: Request, **args: Any) -> Any:
        query = request.query_params
        result = await answer(op, after=query.get("after"), limit=query.get("limit"), **args)
        return result if isinstance(result, JSONResponse) else JSONResponse({"object": "list", **result})

    async def list_jobs(request: Request) -> Any:
        result = await answer("list")
        if isinstance(result, JSONResponse):
            return result
        after, limit = request.query_params.get("after"), request.query_params.get("limit")
        ids = [job["id"] for job in result]
        start = ids.index(after) + 1 if after in ids else 0
        try:
            count = int(limit) if limit is not None else 20
        except ValueError:
            return error_response(400, f"'limit' must be an integer, got {limit!r}", param="limit",
                                  code="invalid_limit")
        page = result[start:start + max(count, 0)]
        return JSONResponse({"object": "list", "data": page, "has_more": start + len(page) < len(result)})

    async def create_job(request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "the body must be JSON: OpenAI's fine-tuning job create, e.g. {\"model\": "
                                  "..., \"training_file\": \"train.jsonl\"}", code="invalid_json")
        result = await answer("create", body=body)
        if isinstance(result, JSONResponse):
            return result
        if on_created is not None:
            on_created(result)
        return JSONResponse(result)

    async def get_job(job_id: str) -> Any:
        return as_json(await answer("get", id=job_id))

    def control(op: str) -> Callable[..., Any]:
        # a function per operation: FastAPI reads a route's parameters from its signature, so `op` cannot be one
        async def route(job_id: str) -> Any:
            return as_json(await answer(op, id=job_id))

        return route

    async def job_events(job_id: str, request: Request) -> Any:
        return await paged("events", request, id=job_id)

    async def job_checkpoints(job_id: str, request: Request) -> Any:
        return await paged("checkpoints", request, id=job_id)

    def tagged(op: str, endpoint: Callable[..., Any]) -> Callable[..., Any]:
        return mark(op, endpoint) if mark is not None else endpoint

    router = APIRouter()
    router.add_api_route(JOBS_PREFIX, tagged("list", list_jobs), methods=["GET"], name="list_fine_tuning_jobs")
    router.add_api_route(JOBS_PREFIX, tagged("create", create_job), methods=["POST"],
                         name="create_fine_tuning_job")
    router.add_api_route(JOBS_PREFIX + "/{job_id}", tagged("get", get_job), methods=["GET"],
                         name="get_fine_tuning_job")
    for op in CONTROL_OPS:
        router.add_api_route(f"{JOBS_PREFIX}/{{job_id}}/{op}", tagged(op, control(op)), methods=["POST"],
                             name=f"{op}_fine_tuning_job")
    router.add_api_route(JOBS_PREFIX + "/{job_id}/events", tagged("events", job_events), methods=["GET"],
                         name="fine_tuning_job_events")
    router.add_api_route(JOBS_PREFIX + "/{job_id}/checkpoints", tagged("checkpoints", job_checkpoints),
                         methods=["GET"], name="fine_tuning_job_checkpoints")
    return router
