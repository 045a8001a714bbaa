"""The fine-tuning jobs API inside SGLang's own HTTP server (``python -m sglang.launch_server``).

The same routes, JSON and errors as under ``vllm serve`` (:mod:`deltaserve_core.jobs_routes`), mounted on SGLang's
FastAPI ``app`` when ``DELTASERVE_JOB`` names a job or ``DELTASERVE_JOBS_DATA_DIR`` lets clients create one.

Where each part runs:

* API server (the launching process, which holds SGLang's ``TokenizerManager`` in its default single-tokenizer
  mode): :func:`attach_http_routes`, called by the ``prepare_server_args`` hook once :func:`.serving.preflight`
  accepted the job, adds the routes to ``sglang.srt.entrypoints.http_server.app`` before SGLang's launcher adds
  its API-key middleware to that app and starts uvicorn. A route sends one :class:`DeltaServeJobReq` to the
  scheduler over SGLang's own control channel (``TokenizerManager._dispatch_to_scheduler``, the socket every
  control request such as ``/set_internal_state`` takes) and waits for the :class:`DeltaServeJobReqOutput` with
  the same ``rid``, which SGLang's tokenizer loop hands to ``TokenizerManager._result_dispatcher``.
* Scheduler (its subprocess, where the job's ``CoServer`` lives): :func:`serve_job_calls` adds the request type to
  ``Scheduler._request_dispatcher``, so the call runs in ``process_input_requests`` at the top of a loop
  iteration, between two steps, on the thread that drives the job (as vLLM's ``collective_rpc`` does).

Both message types are added to SGLang's msgpack IPC decoder with its ``io_struct.hook_custom_types``; the
payloads are JSON text, so no field type of SGLang's IPC schema constrains them.

Auth: SGLang's ``--api-key``/``--admin-api-key`` middleware is an ASGI middleware over the whole app that looks up
each request's route in ``app.router.routes`` (``sglang.srt.utils.auth``), so it covers these routes as it covers
SGLang's own. Reads are ``AuthLevel.NORMAL`` (``--api-key``); create, pause, resume and cancel are
``ADMIN_OPTIONAL``, as SGLang marks its own state-changing endpoints (``/set_internal_state``): with
``--admin-api-key`` they need that key. SGLang adds the middleware only in single-tokenizer mode; with
``--tokenizer-worker-num`` > 1 the routes are not mounted (the workers re-import the app in other processes), and
a warning says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

# SGLang's IPC message base: imported only where SGLang runs (the launcher once a job passed preflight, the scheduler)
from sglang.srt.managers.io_struct import BaseReq

from deltaserve_core.jobs_routes import CONTROL_OPS, build_jobs_router

__all__ = ["DeltaServeJobReq", "DeltaServeJobReqOutput", "attach_http_routes", "register_types",
           "serve_job_calls"]

log = logging.getLogger("deltaserve.sglang")

#: an engine busy with a long step answers between steps; past this the call is reported as failed
CALL_TIMEOUT_S = 60.0


class DeltaServeJobReq(BaseReq, kw_only=True):
    """API server -> scheduler: one job call; ``args_json``: job_call's ``args`` as JSON text."""

    op: str
    args_json: str


class DeltaServeJobReqOutput(BaseReq, kw_only=True):
    """Scheduler -> API server: job_call's answer as JSON text, ``rid`` the request's."""

    answer_json: str


def register_types() -> None:
    """Make SGLang's IPC decoder of this process accept both message types (idempotent)."""
    from sglang.srt.managers import io_struct

    io_struct.hook_custom_types(DeltaServeJobReq, DeltaServeJobReqOutput)


# ------------------------------------------------------------------------------------------- scheduler process

def serve_job_calls(scheduler: Any, runtime: Any) -> None:
    """Answer :class:`DeltaServeJobReq` in ``scheduler``'s own request dispatch, against ``runtime``'s job."""
    from sglang.utils import TypeBasedDispatcher

    register_types()

    def handle(req: DeltaServeJobReq) -> DeltaServeJobReqOutput:
        try:
            answer = runtime.job_call(req.op, json.loads(req.args_json))
        except Exception as exc:  # noqa: BLE001 - a failed call is the client's 500, the scheduler loop goes on
            log.exception("DeltaServe jobs API: %s failed in the scheduler", req.op)
            answer = {"status": 500, "error": {"message": f"the job call {req.op!r} failed: {exc}",
                                               "type": "server_error", "param": None, "code": "job_call_failed"}}
        return DeltaServeJobReqOutput(rid=req.rid, answer_json=json.dumps(answer))

    scheduler._request_dispatcher += TypeBasedDispatcher([(DeltaServeJobReq, handle)])


# ------------------------------------------------------------------------------------------- API server process

class _SchedulerCaller:
    """Sends job calls to the scheduler through the TokenizerManager and matches answers by ``rid``.

    Not SGLang's ``FanOutCommunicator``: that one pairs answers with callers by arrival order, so an answer that
    comes after its caller timed out would be taken as the next call's."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._manager: Any = None

    def _tokenizer_manager(self) -> Any:
        if self._manager is None:
            from sglang.srt.entrypoints import http_server
            from sglang.utils import TypeBasedDispatcher

            state = http_server.get_global_state()
            if state is None or state.tokenizer_manager is None:
                raise RuntimeError("SGLang's HTTP server has not set up its TokenizerManager yet")
            manager = state.tokenizer_manager
            manager._result_dispatcher += TypeBasedDispatcher([(DeltaServeJobReqOutput, self._answered)])
            self._manager = manager
        return self._manager

    def _answered(self, out: DeltaServeJobReqOutput) -> None:
        waiter = self._waiting.pop(out.rid or "", None)
        if waiter is not None and not waiter.done():
            waiter.set_result(json.loads(out.answer_json))

    async def __call__(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        manager = self._tokenizer_manager()
        manager.auto_create_handle_loop()  # the loop that reads the scheduler's answers
        rid = f"deltaserve-job-{uuid.uuid4().hex}"
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = waiter
        try:
            manager._dispatch_to_scheduler(DeltaServeJobReq(rid=rid, op=op, args_json=json.dumps(args)))
            return await asyncio.wait_for(waiter, CALL_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no answer from the scheduler within {CALL_TIMEOUT_S:.0f} s") from None
        finally:
            self._waiting.pop(rid, None)


def _mark(op: str, endpoint: Any) -> Any:
    from sglang.srt.utils.auth import AuthLevel, auth_level

    return auth_level(AuthLevel.ADMIN_OPTIONAL)(endpoint) if op in (*CONTROL_OPS, "create") else endpoint


def attach_http_routes(server_args: Any) -> bool:
    """In the launching process of ``sglang.launch_server``: mount the jobs routes on SGLang's app; whether they
    were mounted."""
    if int(getattr(server_args, "tokenizer_worker_num", 1) or 1) > 1:
        log.warning("DeltaServe jobs API: not available with --tokenizer-worker-num > 1 (SGLang's workers serve "
                    "HTTP from other processes, and its API-key middleware is single-tokenizer only); "
                    "/v1/fine_tuning/jobs answers 404")
        return False
    from sglang.srt.entrypoints import http_server

    app = http_server.app
    if any(getattr(r, "path", None) == "/v1/fine_tuning/jobs" for r in app.router.routes):
        return True  # both launcher hooks may get here
    register_types()
    router = build_jobs_router(_SchedulerCaller(), mark=_mark)
    for route in router.routes:
        # Route by route onto the app's own router, not include_router: FastAPI 0.165 includes a router lazily
        # (one nested route), and SGLang's auth middleware reads each endpoint's auth level from the app's
        # top-level routes only, so the admin level of pause/resume/cancel would be lost.
        app.router.add_api_route(route.path, route.endpoint, methods=sorted(route.methods), name=route.name)
    if not (getattr(server_args, "api_key", None) or getattr(server_args, "admin_api_key", None)):
        # SGLang's key is the only guard of these routes; without one, whoever reaches the port can cancel the job
        log.warning("DeltaServe jobs API without an API key: anyone who can reach this server can pause or cancel "
                    "the fine-tuning job; start SGLang with --api-key (docs/security.md)")
    return True
