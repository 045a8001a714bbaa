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

import copy
import itertools
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal, Protocol

__all__ = ["EVENT_LOG_SIZE", "JOB_STATUSES", "ControlledJob", "EventLog", "JobCallError", "job_call", "job_id",
           "merge_rank_answers"]

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


# ---------------------------------------------------------------------------------------------- data-parallel ranks


def merge_rank_answers(op: str, answers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One answer to a call that every data-parallel rank of the job answered (one :func:`job_call` answer per
    rank, each from the process that owns that rank's CoServer).

    A job (``get``, each job of ``list``) is rank 0's, with the job's totals where the ranks' shares add up
    (``trained_tokens``, samples completed, the fraction done) and ``deltaserve.data_parallel`` holding every
    rank's progress and the total. A control call went to every rank: its answer is the first error, else rank
    0's. Events and checkpoints are rank 0's (every rank applies the same global steps and checkpoints at the same
    ones, in its own folder)."""
    if not answers:
        raise ValueError("no rank answered")
    if len(answers) == 1:
        return answers[0]
    failed = next((a for a in answers if "error" in a), None)
    if failed is not None:
        return failed
    if op == "get":
        return {"result": _merge_jobs([a["result"] for a in answers])}
    if op == "list":
        by_id: dict[str, list[dict[str, Any]]] = {}
        for a in answers:
            for job in a["result"]:
                by_id.setdefault(job["id"], []).append(job)
        return {"result": [_merge_jobs(by_id[job["id"]]) for job in answers[0]["result"]]}
    return answers[0]


def _merged_status(statuses: Sequence[str]) -> str:
    """The job's status from its ranks': failed if one failed, what they all say when they agree, else running
    while one still runs (a rank that finished its share waits for the others)."""
    if "failed" in statuses:
        return "failed"
    if len(set(statuses)) == 1:
        return statuses[0]
    return "running" if "running" in statuses else statuses[0]


def _merge_jobs(jobs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ranks = []
    for job in jobs:
        ds = job["deltaserve"]
        dp = ds.get("data_parallel") or {}
        ranks.append({"rank": dp.get("rank"), "status": job["status"], "trained_tokens": int(job["trained_tokens"]),
                      "samples_completed": int(ds["progress"]["samples_completed"]), "step": ds["step"],
                      "optimizer_steps_this_run": ds["optimizer_steps_this_run"], "loss": ds["loss"],
                      "global_steps_with_own_samples": dp.get("global_steps_with_own_samples"),
                      "stale_parts": dp.get("stale_parts"), "backward_busy": ds["backward_busy"],
                      "slo_requests": (ds.get("slo_attainment") or {}).get("requests")})
    if len(jobs) > 1 and any(r["rank"] is None for r in ranks):
        # several engines answered for a job that is not data-parallel: they train independent copies
        raise ValueError(f"job {jobs[0]['id']} answered from {len(jobs)} engines without a data-parallel rank")
    order = sorted(range(len(jobs)), key=lambda i: ranks[i]["rank"] if ranks[i]["rank"] is not None else -1)
    ranks = [ranks[i] for i in order]
    merged = copy.deepcopy(jobs[order[0]])  # rank 0's (the only one without data parallelism)
    ds = merged["deltaserve"]
    tokens = sum(r["trained_tokens"] for r in ranks)
    samples = sum(r["samples_completed"] for r in ranks)
    merged["status"] = _merged_status([r["status"] for r in ranks])
    merged["trained_tokens"] = tokens
    progress = ds["progress"]
    progress["samples_completed"] = samples
    progress["fraction"] = samples / progress["samples_total"] if progress["samples_total"] else 0.0
    progress["epoch"] = min(j["deltaserve"]["progress"]["epoch"] for j in jobs)
    steps = [r["step"] for r in ranks]
    ds["data_parallel"] = {
        "world_size": (ds.get("data_parallel") or {}).get("world_size", len(jobs)), "answered": len(ranks),
        "last_global_step": (ds.get("data_parallel") or {}).get("last_global_step"),
        "ranks": ranks,
        "total": {"trained_tokens": tokens, "samples_completed": samples, "step": max(steps),
                  "steps_agree": len(set(steps)) == 1},
    }
    return merged
