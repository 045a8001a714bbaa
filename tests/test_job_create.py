"""OpenAI's create body to a job (``deltaserve_core.job_create``), without an engine: the fields' mapping, every
refusal naming the field, the value and the fix, the data directory's fence (``..``, symlinks), and the jobs folder
a restart reads. The real servers create jobs in tests/test_vllm_jobs_api.py and tests/sglang/test_sglang_jobs_api.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deltaserve_core.job_control import JobCallError
from deltaserve_core.job_create import (JobsSettings, job_from_request, operator_state, save_created,
                                        save_operator_state, startup_job, startup_jobs)

MODEL = "/models/tiny"


@pytest.fixture()
def settings(tmp_path: Path) -> JobsSettings:
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.json").write_text(json.dumps([{"instruction": "a", "input": "", "output": "b"}]))
    (tmp_path / "secret.json").write_text("[]")
    return JobsSettings.from_mapping({"data_dir": "data", "dir": "jobs"}, base=tmp_path, where="jobs")


def _refused(settings: JobsSettings, body: dict[str, Any], status: int = 400) -> JobCallError:
    with pytest.raises(JobCallError) as caught:
        job_from_request({"model": MODEL, "training_file": "train.json", **body}, settings, served_models=(MODEL,))
    assert caught.value.status == status, caught.value.message
    return caught.value


def test_openai_fields_map_onto_the_job(settings: JobsSettings) -> None:
    created = job_from_request({
        "model": MODEL, "training_file": "train.json", "suffix": "mine", "seed": 7, "metadata": {"team": "a"},
        "hyperparameters": {"n_epochs": 3, "learning_rate_multiplier": 2, "batch_size": 64},
        "deltaserve": {"lora": {"r": 4}, "slo": {"ttft_s": 2.0}, "max_length": 128}}, settings, served_models=(MODEL,))
    job = created.job
    assert job.adapter_name == "mine" and job.epochs == 3 and job.lr == pytest.approx(2e-3) and job.seed == 7
    assert job.backward_batch_tokens == 64 and job.lora.r == 4 and job.slo.ttft_s == 2.0 and job.max_length == 128
    assert job.dataset == str((settings.data_dir / "train.json").resolve())  # type: ignore[operator]
    assert job.checkpoint.dir == str(settings.dir / "mine" / "checkpoints")
    assert created.record["metadata"] == {"team": "a"} and created.record["suffix"] == "mine"
    auto = job_from_request({"model": MODEL, "training_file": str(settings.data_dir / "train.json"),
                             "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": "auto"}}}},
                            settings, served_models=(MODEL,))
    assert auto.job.epochs == 1 and auto.job.adapter_name.startswith("job-")


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"model": "other"}, "model", "'other' is not served here"),
    ({"training_file": "nope.json"}, "training_file", "not a file"),
    ({"suffix": "a/b"}, "suffix", "'a/b'"),
    ({"hyperparameters": {"n_epochs": 0}}, "hyperparameters.n_epochs", "got 0"),
    ({"hyperparameters": {"epochs": 2}}, "hyperparameters", "unknown key(s) ['epochs']"),
    ({"hyperparameters": {"learning_rate_multiplier": -1}}, "hyperparameters.learning_rate_multiplier", "-1"),
    ({"deltaserve": {"lora": {"rr": 4}}}, "deltaserve.lora.rr", "did you mean 'r'"),
    ({"deltaserve": {"lora": {"r": 0}}}, "deltaserve.lora.r", "got 0"),
    ({"deltaserve": {"dataset": "x"}}, "deltaserve.dataset", "training_file"),
    ({"deltaserve": {"checkpoint": {"dir": "/tmp/x"}}}, "deltaserve.checkpoint.dir", "jobs folder"),
    ({"deltaserve": {"epochs": 2}, "hyperparameters": {"n_epochs": 2}}, "deltaserve.epochs", "give it once"),
    ({"validation_file": "v.json"}, "validation_file", "not offered"),
    ({"learning_rate": 1}, "learning_rate", "unknown field"),
    ({"metadata": {"k": 1}}, "metadata", "string values"),
])
def test_a_bad_body_is_refused_naming_the_field(settings: JobsSettings, body: dict[str, Any], param: str,
                                                words: str) -> None:
    error = _refused(settings, body)
    assert error.param == param and words in error.message, error.message


def test_the_training_file_stays_inside_the_data_directory(settings: JobsSettings, tmp_path: Path) -> None:
    for path in ("../secret.json", str(tmp_path / "secret.json")):
        error = _refused(settings, {"training_file": path}, 403)
        assert error.code == "training_file_outside_data_dir" and "outside" in error.message
    (settings.data_dir / "link.json").symlink_to(tmp_path / "secret.json")  # type: ignore[operator]
    assert _refused(settings, {"training_file": "link.json"}, 403).param == "training_file"


def test_a_created_job_is_kept_for_the_restart(settings: JobsSettings, tmp_path: Path) -> None:
    declared = tmp_path / "job.yaml"
    declared.write_text(f"dataset: {settings.data_dir}/train.json\nadapter_name: declared\n")
    job, record = startup_job(declared, settings)
    assert job is not None and job.adapter_name == "declared" and record is None
    created = job_from_request({"model": MODEL, "training_file": "train.json", "suffix": "kept",
                                "metadata": {"k": "v"}}, settings, served_models=(MODEL,))
    save_created(created, settings)
    job, record = startup_job(declared, settings)
    assert job == created.job and record is not None and record.record == created.record
    assert _refused(settings, {"suffix": "kept"}, 409).code == "suffix_taken"


def test_the_settings_name_their_key() -> None:
    with pytest.raises(ValueError, match=r"jobs.data_dir: .* is not a folder"):
        JobsSettings.from_mapping({"data_dir": "/no/such/folder"}, base=Path("/"), where="jobs")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['data'\]"):
        JobsSettings.from_mapping({"data": "/"}, base=Path("/"), where="jobs")


class _Running:
    """A job as the runtime sees it, still running (the 409 case)."""

    job_id = "ftjob-declared"

    def refresh(self) -> None:
        pass

    def job_status(self) -> dict[str, Any]:
        return {"object": "fine_tuning.job", "id": self.job_id, "status": "running"}


def test_the_runtime_refuses_a_create_it_cannot_run(settings: JobsSettings) -> None:
    from deltaserve_core.runtime import EngineRuntime

    body = {"model": MODEL, "training_file": "train.json"}

    def create(runtime: EngineRuntime) -> dict[str, Any]:
        answer = runtime.job_call("create", {"body": body})
        assert "error" in answer, answer
        return answer

    off = JobsSettings(None, settings.dir, how_to_enable="set DATA_DIR=/data")
    answer = create(EngineRuntime(None, engine="test", grace_s=1, jobs=off, served_models=(MODEL,)))
    assert answer["status"] == 403 and "set DATA_DIR=/data" in answer["error"]["message"]
    answer = create(EngineRuntime(None, engine="test", grace_s=1, jobs=settings, served_models=(MODEL,), engines=2))
    assert answer["status"] == 501 and answer["error"]["code"] == "create_unsupported_data_parallel"
    runtime = EngineRuntime(None, engine="test", grace_s=1, jobs=settings, served_models=(MODEL,))
    running = _Running()
    runtime.sharing = SimpleNamespace(jobs=(running,))  # type: ignore[assignment]
    runtime._known[running.job_id] = running
    answer = create(runtime)  # jobs.max_concurrent is 1 unless the operator raises it
    assert answer["status"] == 409 and answer["error"]["code"] == "job_limit_reached", answer
    message = answer["error"]["message"]
    assert "ftjob-declared (running)" in message and "jobs.max_concurrent is 1" in message, message
    assert "cancel one" in message and not settings.dir.exists()  # nothing written
    assert runtime.job_call("list")["result"][0]["metadata"] is None  # the declared job has none


def test_the_limit_of_concurrent_jobs_is_checked_naming_the_key() -> None:
    assert JobsSettings.from_mapping({}, base=Path("/"), where="jobs").max_concurrent == 1
    assert JobsSettings.from_mapping({"max_concurrent": "3"}, base=Path("/"), where="jobs").max_concurrent == 3
    for bad in (0, -1, 1.5, True, "two", 65):
        with pytest.raises(ValueError, match=r"jobs.max_concurrent: must be a whole number of jobs from 1 to 64, "
                                             rf"got {re.escape(repr(bad))}; set it to"):
            JobsSettings.from_mapping({"max_concurrent": bad}, base=Path("/"), where="jobs")
    kept = JobsSettings.from_mapping({"max_concurrent": 2}, base=Path("/"), where="jobs")
    assert JobsSettings.from_mapping(kept.as_mapping(), base=Path("/"), where="jobs").max_concurrent == 2


def test_a_restart_starts_every_job_that_did_not_end(settings: JobsSettings, tmp_path: Path) -> None:
    declared = tmp_path / "job.yaml"
    declared.write_text(f"dataset: {settings.data_dir}/train.json\nadapter_name: declared\n")
    made = []
    for suffix in ("one", "two", "three"):
        created = job_from_request({"model": MODEL, "training_file": "train.json", "suffix": suffix}, settings,
                                   served_models=(MODEL,))
        save_created(created, settings)
        made.append(created)
    save_operator_state(made[0].job, paused=True)
    save_operator_state(made[1].job, ended="cancelled")
    save_operator_state(made[2].job, ended="failed")  # a failed job is tried again
    jobs = startup_jobs(declared, settings)
    assert [j.adapter_name for j, _ in jobs] == ["declared", "one", "three"]
    assert jobs[0][1] is None and jobs[1][1] is not None and jobs[1][1].record == made[0].record
    assert operator_state(made[0].job) == {"paused": True}
    assert startup_job(declared, settings)[0].adapter_name == "three"  # type: ignore[union-attr]
