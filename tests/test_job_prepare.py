"""A created job while it is prepared off the engine's thread (deltaserve_core.job_prepare), with a stand-in
controller: what the jobs API shows at each state, a failure's error object, a cancel before and after the
preparation ends, and that whatever was prepared is released. The real engines' runs are in
tests/test_vllm_jobs_api.py and tests/sglang/test_sglang_jobs_api.py."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import pytest

from deltaserve_core.job_control import EventLog, JobCallError
from deltaserve_core.job_create import JobsSettings, job_from_request
from deltaserve_core.job_prepare import PreparingJob

MODEL = "base-model"


class _Co:
    """What PreparingJob uses of a CoServer; ``prepare`` waits for ``go`` (the test decides when it ends)."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.events = EventLog()
        self.dataset = [1, 2, 3]
        self.backward: Any = None
        self.go = threading.Event()
        self.preparing = threading.Event()
        self.closed = 0
        self.fail = fail

    def prepare(self) -> _Co:
        self.backward = self  # a backward process exists from here on
        self.preparing.set()
        self.go.wait(60)
        if self.fail is not None:
            raise self.fail
        return self

    def kill(self) -> None:  # the backward's kill: ends the wait for its start
        self.fail = RuntimeError("backward process exited during start-up")
        self.go.set()

    def close(self) -> None:
        self.closed += 1
        self.backward = None


@pytest.fixture
def created(tmp_path: Path) -> Any:
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.json").write_text("[]")
    settings = JobsSettings(data, tmp_path / "jobs")
    return job_from_request({"model": MODEL, "training_file": "train.json", "suffix": "prep"}, settings,
                            served_models=(MODEL,))


def _prep(created: Any, build: Any) -> tuple[PreparingJob, queue.SimpleQueue]:
    done: queue.SimpleQueue = queue.SimpleQueue()
    return PreparingJob(created, MODEL, build=build, done=done.put), done


def test_a_prepared_job_is_handed_over(created: Any) -> None:
    co = _Co()
    prep, done = _prep(created, lambda: co)
    job = prep.job_status()
    assert job["status"] == "validating_files" and job["id"] == "ftjob-prep" and job["model"] == MODEL
    assert job["error"] is None and job["deltaserve"]["progress"]["samples_total"] is None
    prep.start()
    assert co.preparing.wait(60)
    assert prep.job_status()["status"] == "validating_files"
    with pytest.raises(JobCallError) as refused:
        prep.pause()
    assert refused.value.status == 409 and refused.value.code == "job_not_running"
    co.go.set()
    assert done.get(timeout=60) is prep and prep.state == "ready" and co.events is prep.events
    prep.attached()
    assert prep.job_status()["status"] == "running" and co.closed == 0


def test_a_failed_preparation_is_the_jobs_error(created: Any) -> None:
    bad = JobCallError(400, "training_file: not a usable dataset: nope", code="invalid_training_file",
                       param="training_file")

    def build() -> _Co:
        raise bad

    prep, done = _prep(created, build)
    prep.start()
    assert done.get(timeout=60) is prep
    job = prep.job_status()
    assert job["status"] == "failed" and job["finished_at"] is not None
    assert job["error"] == {"code": "invalid_training_file", "message": bad.message, "param": "training_file"}
    assert prep.events.page()[0][0]["level"] == "error"
    co = _Co(fail=OSError("no space left on device"))
    co.go.set()
    prep, done = _prep(created, lambda: co)
    prep.start()
    assert done.get(timeout=60) is prep
    error = prep.job_status()["error"]
    assert error["code"] == "job_start_failed" and "no space left on device" in error["message"], error
    assert co.closed >= 1  # what the failed start left is released


def test_a_cancel_while_preparing_releases_it(created: Any) -> None:
    co = _Co()
    prep, done = _prep(created, lambda: co)
    prep.start()
    assert co.preparing.wait(60)
    job = prep.cancel()  # kills the starting backward: the preparation ends at once
    assert job["status"] in ("validating_files", "cancelled")
    assert done.get(timeout=60) is prep
    job = prep.job_status()
    assert job["status"] == "cancelled" and job["error"] is None and co.closed >= 1
    assert prep.cancel()["status"] == "cancelled"  # idempotent
    with pytest.raises(JobCallError) as refused:
        prep.resume()
    assert refused.value.code == "job_not_active"


def test_a_cancel_after_the_preparation_releases_it_on_the_engines_thread(created: Any) -> None:
    co = _Co()
    co.go.set()
    prep, done = _prep(created, lambda: co)
    prep.start()
    assert done.get(timeout=60) is prep and prep.state == "ready"
    assert prep.cancel()["status"] == "cancelled" and co.closed == 1


def test_a_server_stopping_releases_it_and_the_job_is_not_over(created: Any) -> None:
    co = _Co()
    prep, done = _prep(created, lambda: co)
    prep.start()
    assert co.preparing.wait(60)
    prep.abandon(stopping=True)
    assert prep.wait(60) and done.get(timeout=60) is prep
    job = prep.job_status()
    # nothing of it runs, and it is prepared again at the next start: not cancelled, not failed
    assert prep.state == "stopped" and co.closed >= 1
    assert job["status"] == "validating_files" and not job["deltaserve"]["cancel_requested"], job
