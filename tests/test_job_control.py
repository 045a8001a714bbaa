"""The operator's controls of a running job on the reference host: pause, resume, cancel, the event log and the
OpenAI-shaped status (:mod:`deltaserve_core.job_control`).

Semantics checked against a real CoServer, backward process and checkpoints: a pause stops admission (no sample
is admitted and nothing more trains once the batch running at the pause has landed) while client requests are
still served; resume trains again; nothing is lost across a pause (every sample of the epoch trained exactly
once); cancel writes a final checkpoint and ends the job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from deltaserve_core.coserve import CoServer
from deltaserve_core.job_config import CheckpointSpec, PublishSpec
from deltaserve_core.job_control import EventLog, JobCallError, job_call
from test_coserve import _job, _model, _requests, dataset, host  # noqa: F401  (fixtures: one host per module)


def _until(host, co: CoServer, cond: Callable[[], bool], what: str, timeout: float = 240.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout:.0f} s ({co.job_status()['status']})"
        if not host.run_idle_step():
            co.poll()
            time.sleep(0.005)


def _idle_steps(host, co: CoServer, n: int) -> None:  # noqa: ANN001
    for _ in range(n):
        host.run_idle_step()
        co.poll()
        time.sleep(0.002)


def _quiet(co: CoServer) -> bool:
    co.poll()
    return not co.wants_steps


def test_pause_stops_admission_serves_clients_and_resume_trains_again(host, dataset: Path,  # noqa: ANN001, F811
                                                                     tmp_path: Path) -> None:
    co = CoServer(host, _job(dataset, tmp_path, epochs=20), latency_model=_model(), backward_threads=1)
    with co:
        assert co.job_status()["status"] == "running"
        _until(host, co, lambda: co.stats.optimizer_steps >= 1, "first optimizer step")
        status = co.pause()
        assert status["status"] == "paused" and status["deltaserve"]["paused_by"] == "operator"
        _until(host, co, lambda: _quiet(co), "the batch running at the pause to land")
        admitted, trained = co.stats.admitted_samples, co.job_status()["trained_tokens"]
        steps = co.stats.optimizer_steps
        _idle_steps(host, co, 40)
        outputs = host.generate(_requests(3, 7))  # inference goes on while fine-tuning is paused
        assert len(outputs) == 3 and all(o.token_ids for o in outputs)
        _idle_steps(host, co, 40)
        assert co.stats.admitted_samples == admitted, "a paused job admitted samples"
        assert co.job_status()["trained_tokens"] == trained and co.stats.optimizer_steps == steps
        assert co.job_status()["estimated_finish"] is None  # no rate while paused
        assert co.pause()["status"] == "paused"  # idempotent
        assert co.resume()["status"] == "running"
        _until(host, co, lambda: co.stats.optimizer_steps > steps, "an optimizer step after resume")
        assert co.job_status()["trained_tokens"] > trained
        messages = [e["message"] for e in reversed(co.events.page(limit=1000)[0])]
        paused = next(i for i, m in enumerate(messages) if "paused by the operator" in m)
        resumed = next(i for i, m in enumerate(messages) if "resumed by the operator" in m)
        assert paused < resumed


def test_nothing_is_lost_across_a_pause(host, dataset: Path, tmp_path: Path) -> None:  # noqa: ANN001, F811
    co = CoServer(host, _job(dataset, tmp_path, epochs=1, publish=PublishSpec(policy="never")),
                  latency_model=_model(), backward_threads=1)
    with co:
        _until(host, co, lambda: co.stats.admitted_samples > 0, "first admission")
        co.pause()  # mid-step: captures not yet trained stay in the buffer
        _until(host, co, lambda: _quiet(co), "quiescence")
        _idle_steps(host, co, 20)
        co.resume()
        _until(host, co, lambda: co.job_status()["status"] == "succeeded", "the end of the job")
        trained = [i for batch in co.stats.trained_batches for i in batch]
        status = co.job_status()
    assert sorted(trained) == sorted(s.sample_id for s in co.dataset.samples), "a sample was lost or trained twice"
    assert status["finished_at"] is not None and status["trained_tokens"] == sum(
        s.num_tokens for s in co.dataset.samples)


def test_cancel_writes_a_final_checkpoint_and_ends_the_job(host, dataset: Path, tmp_path: Path) -> None:  # noqa: ANN001, F811
    co = CoServer(host, _job(dataset, tmp_path, epochs=20, checkpoint=CheckpointSpec(dir=str(tmp_path / "ck"),
                                                                                     every_steps=0)),
                  latency_model=_model(), backward_threads=1)
    with co:
        _until(host, co, lambda: co.stats.optimizer_steps >= 2, "two optimizer steps")
        assert co.job_checkpoints() == []  # periodic checkpoints are off: the cancel's is the only one
        status = co.cancel()
        assert status["status"] in ("running", "cancelled") and (status["deltaserve"]["cancel_requested"]
                                                                 or status["status"] == "cancelled")
        _until(host, co, lambda: co.job_status()["status"] == "cancelled", "cancelled")
        status = co.job_status()
        steps, admitted = co.stats.optimizer_steps, co.stats.admitted_samples
        _idle_steps(host, co, 30)
        assert co.stats.admitted_samples == admitted and co.stats.optimizer_steps == steps
        assert host.generate(_requests(2, 8))  # inference untouched
        checkpoints = co.job_checkpoints()
        assert len(checkpoints) == 1 and checkpoints[0]["step_number"] == status["deltaserve"]["step"] == steps
        assert Path(checkpoints[0]["fine_tuned_model_checkpoint"]).is_dir()
        assert checkpoints[0]["object"] == "fine_tuning.job.checkpoint"
        assert status["finished_at"] is not None
        assert co.cancel()["status"] == "cancelled"  # idempotent
        with pytest.raises(JobCallError) as refused:
            co.pause()
        assert refused.value.status == 409
        assert job_call([co], "resume", {"id": co.job_id})["status"] == 409
        assert not co.wants_steps
    # A restarted server resumes from the cancel's checkpoint: the job stays cancelled (the job file does not
    # restart it), and trains nothing.
    again = CoServer(host, co.job, latency_model=_model(), backward_threads=1)
    with again:
        status = again.job_status()
        assert status["status"] == "cancelled" and status["deltaserve"]["step"] == steps
        assert status["finished_at"] is not None
        _idle_steps(host, again, 30)
        assert again.stats.admitted_samples == 0 and again.stats.optimizer_steps == 0
        assert not again.wants_steps
        assert again.cancel()["status"] == "cancelled"
        assert job_call([again], "resume", {"id": again.job_id})["status"] == 409
        assert any("cancelled before this start" in e["message"] for e in again.events.page(limit=50)[0])


def test_status_events_and_job_call_shapes(host, dataset: Path, tmp_path: Path) -> None:  # noqa: ANN001, F811
    co = CoServer(host, _job(dataset, tmp_path, epochs=20, publish=PublishSpec(policy="every_n_steps",
                                                                               every_steps=1)),
                  latency_model=_model(), backward_threads=1)
    assert co.job_status()["status"] == "validating_files"
    with co:
        _until(host, co, lambda: co.stats.optimizer_steps >= 3 and co.stats.published, "three steps, a publish")
        listed = job_call([co], "list")["result"]
        assert [j["id"] for j in listed] == ["ftjob-" + co.job.adapter_name]
        job = job_call([co], "get", {"id": co.job_id})["result"]
        assert job["object"] == "fine_tuning.job" and job["status"] == "running"
        assert job["fine_tuned_model"] == co.stats.published[-1]
        assert job["trained_tokens"] > 0 and job["deltaserve"]["loss"] is not None
        assert job["deltaserve"]["lora"]["r"] == co.job.lora.r
        assert job["deltaserve"]["published"][-1]["step"] is not None
        assert job_call([co], "get", {"id": "ftjob-nope"})["status"] == 404
        assert job_call([co], "events", {"id": co.job_id, "limit": 0})["status"] == 400
        first = job_call([co], "events", {"id": co.job_id, "limit": 2})["result"]
        assert len(first["data"]) == 2 and first["has_more"]
        second = job_call([co], "events", {"id": co.job_id, "after": first["data"][-1]["id"], "limit": 2})["result"]
        ids = [int(e["id"].split("-")[1]) for e in first["data"] + second["data"]]
        assert ids == sorted(ids, reverse=True) and len(set(ids)) == 4  # newest first, no overlap
        assert any(e["type"] == "metrics" and "train_loss" in e["data"] for e in co.events.page(limit=1000)[0])
        assert any(e["message"].startswith("fine-tuning started") for e in co.events.page(limit=1000)[0])


def test_event_log_is_bounded_and_pages_newest_first() -> None:
    log = EventLog(maxlen=5)
    for i in range(8):
        log.add("info", f"m{i}")
    assert len(log) == 5
    page, more = log.page(limit=3)
    assert [e["message"] for e in page] == ["m7", "m6", "m5"] and more
    page, more = log.page(after=page[-1]["id"], limit=3)
    assert [e["message"] for e in page] == ["m4", "m3"] and not more
    with pytest.raises(JobCallError):
        log.page(after="bogus", limit=3)
