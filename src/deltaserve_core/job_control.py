"""An operator's view of a running fine-tuning job: OpenAI-shaped status, events and checkpoints, and the calls
that pause, resume and cancel it.

Engine-agnostic: the engine adapters expose :func:`job_call` over whatever reaches the process that owns the
:class:`~deltaserve_core.coserve.CoServer` (under ``vllm serve``: ``collective_rpc`` into the EngineCore, see
:mod:`deltaserve_vllm.jobs_api`). Every answer is plain JSON data, because it crosses a process boundary.

The shapes follow OpenAI's fine-tuning API (``fine_tuning.job``, ``fine_tuning.job.event``,
``fine_tuning.job.checkpoint``), so existing clients can read them; what only DeltaServe has (SLOs, the LoRA
settings, published versions, SLO attainment) is under the job's ``deltaserve`` key.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import Any, Literal, Protocol

__all__ = ["EVENT_LOG_SIZE", "JOB_STATUSES", "ControlledJob", "EventLog", "JobCallError", "job_call", "job_id"]

#: events kept per job; older ones are dropped (the server's log keeps everything)
EVENT_LOG_SIZE = 1000
#: OpenAI's job statuses plus ``paused`` (fine-tuning stopped admitting, inference untouched)
JOB_STATUSES = ("validating_files", "queued", "running", "paused", "succeeded", "failed", "cancelled")

Level = Literal["info", "warn", "error"]


def job_id(adapter_name: str) -> str:
    """The job's id: stable across restarts of the same job, so a client's saved id keeps working."""
    return f"ftjob-{adapter_name}"


class EventLog:
    """A bounded log of what happened to one job, newest kept; ids grow, so a client pages with ``after``."""

    def __init__(self, maxlen: int = EVENT_LOG_SIZE) -> None:
        self._events: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self._seq = itertools.count(1)

    def add(self, level: Level, message: str, *, type: Literal["message", "metrics"] = "message",
            data: dict[str, Any] | None = None) -> dict[str, Any]:
        event: dict[str, Any] = {"object": "fine_tuning.job.event", "id": f"ftevent-{next(self._seq)}",
                                 "created_at": int(time.time()), "level": level, "type": type, "message": message}
        if data is not None:
            event["data"] = data
        self._events.append(event)
        return event

    def __len__(self) -> int:
        return len(self._events)

    def page(self, after: str | None = None, limit: int = 20) -> tuple[list[dict[str, Any]], bool]:
        """Newest first, as OpenAI lists events; ``after``: an event id of the previous page, the next page starts
        with the event just older than it. Returns (events, whether older ones remain)."""
        older: list[dict[str, Any]] = list(reversed(self._events))
        if after is not None:
            cut = _seq_of(after)
            older = [e for e in older if _seq_of(e["id"]) < cut]
        return older[:limit], len(older) > limit


def _seq_of(event_id: str) -> int:
    tail = event_id.rsplit("-", 1)[-1]
    if not tail.isdigit():
        raise JobCallError(400, f"'after' must be an event id such as 'ftevent-12', got {event_id!r}",
                           code="invalid_cursor", param="after")
    return int(tail)


class JobCallError(Exception):
    """A job call the caller got wrong (unknown job, a transition its status does not allow); ``status`` is the
    HTTP status an API answers with."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type = status, message, code, param, type

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "error": {"message": self.message, "type": self.type, "param": self.param,
                                                 "code": self.code}}


class ControlledJob(Protocol):
    """What :func:`job_call` needs of a job (implemented by :class:`~deltaserve_core.coserve.CoServer`); a protocol,
    so this module stays below the controller in the import graph."""

    job_id: str
    events: EventLog

    def refresh(self) -> None: ...

    def job_status(self) -> dict[str, Any]: ...

    def job_checkpoints(self) -> list[dict[str, Any]]: ...

    def pause(self) -> dict[str, Any]: ...

    def resume(self) -> dict[str, Any]: ...

    def cancel(self) -> dict[str, Any]: ...


_OPS = ("list", "get", "pause", "resume", "cancel", "events", "checkpoints")


def job_call(coservers: list[ControlledJob], op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one jobs-API call against the jobs of this process: ``{"result": ...}`` or ``{"status": N, "error":
    {...}}`` (OpenAI's error object). ``op``: list, get, pause, resume, cancel, events, checkpoints; ``args``:
    ``id`` (all but list), ``after`` and ``limit`` (events, checkpoints)."""
    args = dict(args or {})
    try:
        if op not in _OPS:
            raise JobCallError(400, f"unknown job operation {op!r}; one of {', '.join(_OPS)}")
        for co in coservers:
            co.refresh()  # answers from a paused, idle engine reflect what the backward finished since
        if op == "list":
            return {"result": [co.job_status() for co in coservers]}
        wanted = args.get("id")
        co = next((c for c in coservers if c.job_id == wanted), None)
        if co is None:
            known = ", ".join(c.job_id for c in coservers) or "none"
            raise JobCallError(404, f"no fine-tuning job {wanted!r} on this server (jobs: {known})",
                               code="job_not_found", param="id")
        if op == "get":
            return {"result": co.job_status()}
        if op in ("pause", "resume", "cancel"):
            return {"result": getattr(co, op)()}
        limit = _limit(args.get("limit"))
        after = args.get("after")
        if op == "events":
            data, more = co.events.page(after, limit)
        else:
            data, more = _page(co.job_checkpoints(), after, limit)
        return {"result": {"data": data, "has_more": more}}
    except JobCallError as exc:
        return exc.as_dict()


def _limit(value: Any) -> int:
    if value is None:
        return 20
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if not 1 <= n <= 1000:
        raise JobCallError(400, f"'limit' must be an integer from 1 to 1000, got {value!r}", code="invalid_limit",
                           param="limit")
    return n


def _page(items: list[dict[str, Any]], after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """Newest first; ``after``: an item id of the previous page."""
    newest = list(reversed(items))
    if after is not None:
        ids = [i["id"] for i in newest]
        if after not in ids:
            raise JobCallError(400, f"'after' names no checkpoint of this job: {after!r}", code="invalid_cursor",
                               param="after")
        newest = newest[ids.index(after) + 1:]
    return newest[:limit], len(newest) > limit
