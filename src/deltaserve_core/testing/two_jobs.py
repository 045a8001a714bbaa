"""The operator's two-jobs scenario against a real server's jobs API and ``/metrics``, the same on every engine.

tests/test_vllm_jobs_api.py (``vllm serve``) and tests/sglang/test_sglang_jobs_api.py (``sglang.launch_server``)
start their server as an operator does, with room for two jobs, and run these steps in order against it: a second
job created over HTTP trains beside the first, a third create is refused at the limit, pausing the first holds its
trained tokens (in the API and on ``/metrics``) while the second's grow, cancelling the second ends it with a final
checkpoint, and ``/metrics`` shows each job's series with sane values. Every wait polls with a deadline and checks
that the server is alive; nothing compares durations.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Callable
from pathlib import Path
from dataclasses import dataclass
from typing import Any

from ..metrics import JOB_LABEL
from .metrics import Series, assert_sane, parse_exposition
from .servers import alive, http_json, process_tree

__all__ = ["JobsApi", "cancel_the_other", "cancel_while_validating_files", "metrics_show_each_job",
           "pause_one_the_other_trains", "past_the_limit_is_refused", "preparation_failure_is_contained",
           "second_job_trains_beside_the_first", "unloadable_training_file"]


@dataclass
class JobsApi:
    """One server's jobs API and ``/metrics``. ``dead``: the server's last output when its process ended (None while
    it runs), for a wait to stop at once with the reason."""

    base: str
    key: str
    dead: Callable[[], str | None]

    def call(self, method: str, path: str = "", body: Any = None, *, key: str | None = "") -> tuple[int, Any]:
        """``method`` on ``/v1/fine_tuning/jobs{path}``; ``key``: another key (None: none) than the server's."""
        return http_json(method, f"{self.base}/v1/fine_tuning/jobs{path}", body,
                         key=self.key if key == "" else key)

    def job(self, job_id: str) -> dict[str, Any]:
        status, body = self.call("GET", f"/{job_id}")
        assert status == 200, body
        return body

    def ids(self) -> list[str]:
        status, listed = self.call("GET")
        assert status == 200, listed
        return [j["id"] for j in listed["data"]]

    def wait_for(self, job_id: str, cond: Callable[[dict[str, Any]], bool], what: str,
                 timeout: float = 600.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if cond(job):
                return job
            ended = self.dead()
            assert ended is None, ended
            assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s; job: {json.dumps(job)[:2000]}"
            time.sleep(1.0)

    def scrape(self) -> Series:
        status, text = http_json("GET", f"{self.base}/metrics", key=self.key)
        assert status == 200 and isinstance(text, str), str(text)[:2000]
        return parse_exposition(text)

    def metric(self, name: str, job: str, series: Series | None = None) -> float | None:
        """``name``'s series of job ``job`` (its ``finetune_job`` label); None when it is not on the page."""
        return (series if series is not None else self.scrape()).get(name, {}).get(((JOB_LABEL, job),))


def _label(job_id: str) -> str:
    return job_id.removeprefix("ftjob-")


def second_job_trains_beside_the_first(api: JobsApi, first: str, body: dict[str, Any]) -> str:
    """Create ``body``'s job while ``first`` trains: both train. Returns the new job's id."""
    before = api.job(first)["trained_tokens"]
    status, job = api.call("POST", body=body)
    second = f"ftjob-{body['suffix']}"
    # answered before the job's dataset loads and its backward starts, which happen beside the engine's steps
    assert status == 200 and job["id"] == second and job["status"] == "validating_files", job
    assert api.ids() == [first, second]
    api.wait_for(second, lambda j: j["trained_tokens"] > 0, "the second job's first trained tokens")
    api.wait_for(first, lambda j: j["trained_tokens"] > before, "the first job training on beside it")
    assert api.job(first)["status"] == api.job(second)["status"] == "running"
    return second


def past_the_limit_is_refused(api: JobsApi, body: dict[str, Any], active: list[str], setting: str) -> None:
    """A create while the ``active`` jobs fill the limit: 409 naming them and ``setting``; nothing starts."""
    status, answer = api.call("POST", body=body)
    assert status == 409 and answer["error"]["code"] == "job_limit_reached", answer
    message = answer["error"]["message"]
    assert all(f"{job_id} (running)" in message for job_id in active), message
    assert f"{setting} is {len(active)}" in message and "cancel one" in message, message
    assert answer["error"]["type"] == "invalid_request_error"
    assert api.ids() == active


def pause_one_the_other_trains(api: JobsApi, paused: str, other: str) -> None:
    """Pause ``paused``: its trained tokens hold, in the API and on /metrics, while ``other``'s grow on both."""
    status, body = api.call("POST", f"/{paused}/pause")
    assert status == 200 and body["status"] == "paused", body
    job = api.wait_for(paused, lambda j: not j["deltaserve"]["backward_busy"], "the running batch to land")
    held, grown = job["trained_tokens"], api.job(other)["trained_tokens"]
    api.wait_for(other, lambda j: j["trained_tokens"] > grown, "the other job training on")
    metric = "deltaserve_finetune_tokens_total"
    # the exporters sample every second: once the paused job's adapter step on /metrics is its last one, the same
    # sample holds its last token count
    step = api.job(paused)["deltaserve"]["step"]
    deadline = time.monotonic() + 120
    while api.metric("deltaserve_adapter_step", _label(paused), series := api.scrape()) != step:
        assert time.monotonic() < deadline, f"{paused}'s adapter step {step} never reached /metrics"
        time.sleep(1.0)
    counted = api.metric(metric, _label(paused), series)
    while (api.metric(metric, _label(other)) or 0) <= grown:
        assert time.monotonic() < deadline, f"{other}'s trained tokens never grew past {grown} on /metrics"
        time.sleep(1.0)
    assert counted is not None and api.metric(metric, _label(paused)) == counted
    job = api.job(paused)
    assert job["status"] == "paused" and job["trained_tokens"] == held, job
    assert api.job(other)["status"] == "running"


def cancel_the_other(api: JobsApi, other: str, paused: str) -> dict[str, Any]:
    """Cancel ``other``: it ends with a final checkpoint at its last step and cannot be resumed; ``paused`` stays
    paused. Returns the cancelled job."""
    status, body = api.call("POST", f"/{other}/cancel")
    assert status == 200 and body["status"] in ("running", "cancelled"), body
    job = api.wait_for(other, lambda j: j["status"] == "cancelled", "cancelled")
    assert job["finished_at"] is not None
    status, page = api.call("GET", f"/{other}/checkpoints")
    assert status == 200 and page["data"][0]["step_number"] == job["deltaserve"]["step"], (page, job)
    status, body = api.call("POST", f"/{other}/resume")
    assert status == 409 and body["error"]["code"] == "job_not_active", body
    assert api.job(paused)["status"] == "paused"
    return job


def metrics_show_each_job(api: JobsApi, jobs: dict[str, bool], *, multiprocess: bool = False) -> Series:
    """Once /metrics has caught up with each job's step, every job's series are sane (``jobs``: id -> whether it
    published a version). Returns the page."""
    steps = {_label(job_id): api.job(job_id)["deltaserve"]["step"] for job_id in jobs}
    deadline = time.monotonic() + 60
    while True:
        series = api.scrape()
        seen = {label: api.metric("deltaserve_adapter_step", label, series) for label in steps}
        if seen == steps:
            break
        assert time.monotonic() < deadline, (seen, steps)
        time.sleep(1.0)
    for job_id, published in jobs.items():
        assert_sane(series, _label(job_id), published=published, multiprocess=multiprocess)
        assert 0 < (api.metric("deltaserve_data_progress_ratio", _label(job_id), series) or 0) < 1
    return series


def unloadable_training_file(records_file: Path, path: Path) -> Path:
    """``records_file``'s records written to ``path`` gzip-compressed under its ``.json`` name, as an upload that
    was compressed on the way: it is a file inside the data directory, so a create passes every check made before
    it is answered, and fails only when the job's dataset loads."""
    path.write_bytes(gzip.compress(records_file.read_bytes()))
    return path


def preparation_failure_is_contained(api: JobsApi, body: dict[str, Any], others: dict[str, str],
                                     jobs_dir: Path, serve: Callable[[], None]) -> dict[str, Any]:
    """Create ``body``'s job, whose training file cannot be loaded (:func:`unloadable_training_file`): the create
    is answered ``validating_files``, the job then ends ``failed`` with OpenAI's error object naming the training
    file, ``serve`` (a client request) is answered throughout, the ``others`` jobs keep their statuses (id ->
    status), and the job leaves nothing in ``jobs_dir`` for a restart to try again. Returns the failed job."""
    status, job = api.call("POST", body=body)
    job_id = f"ftjob-{body['suffix']}"
    assert status == 200 and job["id"] == job_id and job["status"] == "validating_files", job
    serve()
    failed = api.wait_for(job_id, lambda j: j["status"] != "validating_files", "the preparation to end")
    assert failed["status"] == "failed" and failed["finished_at"] is not None, failed
    error = failed["error"]
    assert error["code"] == "invalid_training_file" and error["param"] == "training_file", error
    assert "not a usable dataset" in error["message"] and "is not a JSON list of records" in error["message"], error
    serve()
    assert {other: api.job(other)["status"] for other in others} == others
    status, events = api.call("GET", f"/{job_id}/events?limit=100")
    assert status == 200 and events["data"][0]["level"] == "error", events
    status, answer = api.call("POST", f"/{job_id}/cancel")
    assert status == 409 and answer["error"]["code"] == "job_not_active", answer
    deadline = time.monotonic() + 60
    while (jobs_dir / body["suffix"]).exists():  # removed on the engine's thread, just after the status changed
        assert time.monotonic() < deadline, f"{jobs_dir / body['suffix']} is still there"
        time.sleep(0.5)
    return failed


def cancel_while_validating_files(api: JobsApi, body: dict[str, Any], server_pid: int) -> dict[str, Any]:
    """Create ``body``'s job and cancel it at once, while it is prepared: it ends ``cancelled`` without training,
    cannot be resumed, and leaves no process of the server behind (its backward process, if one started, is
    gone). Returns the cancelled job."""
    before = set(process_tree(server_pid))
    status, job = api.call("POST", body=body)
    job_id = f"ftjob-{body['suffix']}"
    assert status == 200 and job["status"] == "validating_files", job
    status, job = api.call("POST", f"/{job_id}/cancel")
    assert status == 200, job
    # still preparing (its backward process being released), or released already
    assert job["status"] == "cancelled" or (job["status"] == "validating_files"
                                            and job["deltaserve"]["cancel_requested"]), job
    job = api.wait_for(job_id, lambda j: j["status"] == "cancelled", "cancelled")
    assert job["trained_tokens"] == 0 and job["finished_at"] is not None and job["error"] is None, job
    status, answer = api.call("POST", f"/{job_id}/resume")
    assert status == 409 and answer["error"]["code"] == "job_not_active", answer
    status, events = api.call("GET", f"/{job_id}/events?limit=100")
    assert any("cancelled while validating files" in e["message"] for e in events["data"]), events
    deadline = time.monotonic() + 60
    while left := sorted(p for p in set(process_tree(server_pid)) - before if alive(p)):
        assert time.monotonic() < deadline, f"processes left by the cancelled job: {left}"
        time.sleep(0.5)
    return job
