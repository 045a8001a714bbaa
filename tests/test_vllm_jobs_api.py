"""The fine-tuning jobs API in vLLM's own OpenAI server (``/v1/fine_tuning/jobs``), against a real ``vllm serve``.

One module-scoped server (the API server and the EngineCore in separate processes, as in production) with
``VLLM_PLUGINS=deltaserve,deltaserve_jobs``, ``--api-key`` and ``"jobs": {"data_dir": "data", "max_concurrent": 2}``
next to ``"job"``, running a job long enough not to end by itself. The tests run in file order on it: list and get
show the job training; every route needs the key; pause stops the trained-token count (compared across polls,
never timed), resume makes it grow again; events page; checkpoints are listed; the ``deltaserve jobs`` CLI reads
the same server; bad creates are refused naming the field (a training file outside the data directory among them).
Then the operator's two jobs: a second job created over HTTP trains beside the first, a third is refused (the
limit), pausing the first stops its trained tokens (API and /metrics) while the second's grow, cancelling the second
ends it with a final checkpoint, /metrics shows each job's series; a create is answered ``validating_files`` before
its dataset loads, and a training file that fails to load then fails that job alone, a job cancelled while
validating files leaves no process behind; a created job trains, publishes and succeeds in the room the cancelled
one left, and its versions are served by name beside the first job's; another survives a restart of the server
with the same command line, resuming from its checkpoint, beside the first job, which comes back paused and trains
again once resumed; a request without the key is refused; last, the server stopped while a created job is
prepared leaves no process behind, and the job is kept for the next start. Completions are served throughout.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deltaserve_core.job_config import load_job_config
from deltaserve_core.job_create import operator_state
from deltaserve_core.testing.servers import alive, http_json, process_tree
from deltaserve_core.testing.two_jobs import (JobsApi, cancel_the_other, cancel_while_validating_files,
                                            metrics_show_each_job, past_the_limit_is_refused,
                                            pause_one_the_other_trains, preparation_failure_is_contained,
                                            second_job_trains_beside_the_first, unloadable_training_file)
from test_vllm_serve import (  # noqa: F401  (calibrated: a fixture, resolved against this module's job)
    API_KEY,
    HAVE_VLLM,
    PROMPTS,
    _complete,
    _env,
    _start,
    _stop,
    calibrated,
    write_job,
)

pytestmark = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install 'deltaserve[vllm]')")

JOB_ID = "ftjob-jobsapi"
SECOND = "second"
SECOND_ID = f"ftjob-{SECOND}"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # many epochs: the job must still be running when the tests pause and cancel it
    return write_job(tmp_path_factory.mktemp("jobs-api"), adapter="jobsapi", epochs=200,
                     checkpoint="{dir: ckpt, every_steps: 3, keep: 50}", publish="{policy: on_checkpoint}")


def _with_data_dir(command: list[str]) -> list[str]:
    """``command`` with ``"jobs": {"data_dir": "data", "max_concurrent": 2}`` added to its ``--additional-config
    "deltaserve"``."""
    words = list(command)
    at = words.index("--additional-config") + 1
    extra = json.loads(words[at])
    extra["deltaserve"]["jobs"] = {"data_dir": "data", "max_concurrent": 2}
    words[at] = json.dumps(extra)
    return words


@pytest.fixture(scope="module")
def server(job: Path, tiny_model: Path, calibrated: list[str]) -> Iterator[dict]:  # noqa: F811
    # the server line calibration prints (as an operator copies it), with the jobs routes switched on and a data
    # directory for created jobs (relative to the server's working directory, the job's folder)
    (job.parent / "data").mkdir()
    shutil.copy(job.parent / "data.json", job.parent / "data" / "train.json")
    unloadable_training_file(job.parent / "data.json", job.parent / "data" / "uploaded.json")
    env = dict(_env(job.parent), VLLM_PLUGINS="deltaserve,deltaserve_jobs")
    command = _with_data_dir(calibrated)
    info = _start(job, tiny_model, command, env, "server.log", "--api-key", API_KEY)
    info.update(command=command, env=env, job=job, tiny_model=tiny_model)
    yield info
    _stop(info["proc"])


def _api(server: dict, method: str, path: str, key: str | None = API_KEY) -> tuple[int, Any]:
    return http_json(method, f"{server['base']}/v1/fine_tuning/jobs{path}", key=key)


def _job(server: dict, job_id: str = JOB_ID) -> dict:
    status, body = _api(server, "GET", f"/{job_id}")
    assert status == 200, body
    return body


def _wait_for(server: dict, cond: Callable[[dict], bool], what: str, timeout: float = 300.0,
              job_id: str = JOB_ID) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = _job(server, job_id)
        if cond(job):
            return job
        assert server["proc"].poll() is None, server["log"].read_text()[-4000:]
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s; job: {json.dumps(job)[:2000]}"
        time.sleep(1.0)


def _served(server: dict) -> None:
    status, body = _complete(server["base"], server["model"], PROMPTS[0])
    assert status == 200, body


def test_list_and_get_show_the_job_training(server: dict) -> None:
    job = _wait_for(server, lambda j: j["trained_tokens"] > 0, "a trained token")
    assert job["object"] == "fine_tuning.job" and job["status"] == "running"
    assert job["model"] == server["model"] and job["training_file"].endswith("data.json")
    assert job["hyperparameters"]["n_epochs"] == 200 and job["deltaserve"]["lora"]["r"] == 8
    status, listed = _api(server, "GET", "")
    assert status == 200 and listed["object"] == "list" and listed["has_more"] is False
    assert [j["id"] for j in listed["data"]] == [JOB_ID]
    _served(server)


def test_every_route_needs_the_api_key(server: dict) -> None:
    for method, path in (("GET", ""), ("GET", f"/{JOB_ID}"), ("POST", f"/{JOB_ID}/pause"),
                         ("POST", f"/{JOB_ID}/cancel"), ("GET", f"/{JOB_ID}/events"),
                         ("GET", f"/{JOB_ID}/checkpoints"), ("POST", "")):
        for key in (None, "wrong-" + API_KEY):
            status, body = _api(server, method, path, key=key)
            assert status == 401, (method, path, key is None, body)
    assert _job(server)["status"] == "running"  # the refused pause, cancel and create did nothing
    status, body = _api(server, "POST", "")  # with the key, but no body
    assert status == 400 and body["error"]["code"] == "invalid_json", body
    status, body = _api(server, "GET", "/ftjob-nope")
    assert status == 404 and body["error"]["code"] == "job_not_found", body


def test_pause_stops_training_and_resume_restarts_it(server: dict) -> None:
    status, body = _api(server, "POST", f"/{JOB_ID}/pause")
    assert status == 200 and body["status"] == "paused", body
    job = _wait_for(server, lambda j: not j["deltaserve"]["backward_busy"], "the running batch to land")
    held = job["trained_tokens"]
    for _ in range(4):  # several polls a second apart, with client requests in between
        _served(server)
        time.sleep(1.0)
        job = _job(server)
        assert job["status"] == "paused" and job["trained_tokens"] == held, job
    status, body = _api(server, "POST", f"/{JOB_ID}/resume")
    assert status == 200 and body["status"] == "running", body
    _wait_for(server, lambda j: j["trained_tokens"] > held, "training after resume")
    _served(server)


def test_events_are_paged_newest_first(server: dict) -> None:
    status, first = _api(server, "GET", f"/{JOB_ID}/events?limit=2")
    assert status == 200 and first["object"] == "list" and len(first["data"]) == 2 and first["has_more"], first
    status, second = _api(server, "GET", f"/{JOB_ID}/events?limit=2&after={first['data'][-1]['id']}")
    assert status == 200, second
    ids = [int(e["id"].split("-")[1]) for e in first["data"] + second["data"]]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)
    status, every = _api(server, "GET", f"/{JOB_ID}/events?limit=1000")
    messages = [e["message"] for e in every["data"]]
    assert any("paused by the operator" in m for m in messages) and any("resumed by" in m for m in messages)
    assert {"id", "created_at", "level", "type", "message"} <= set(every["data"][0])
    status, body = _api(server, "GET", f"/{JOB_ID}/events?limit=0")
    assert status == 400 and body["error"]["param"] == "limit", body


def test_checkpoints_are_listed(server: dict) -> None:
    deadline = time.monotonic() + 300
    while True:
        status, page = _api(server, "GET", f"/{JOB_ID}/checkpoints")
        assert status == 200, page
        if page["data"]:
            break
        assert time.monotonic() < deadline, "no checkpoint listed"
        time.sleep(1.0)
    ck = page["data"][0]
    assert ck["object"] == "fine_tuning.job.checkpoint" and ck["step_number"] % 3 == 0
    assert Path(ck["fine_tuned_model_checkpoint"]).is_dir() and "train_loss" in ck["metrics"]


def _cli(server: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deltaserve_core.cli", "jobs", *args, "--server", server["base"]],
                          env=dict(_env(Path(server["log"]).parent), DELTASERVE_API_KEY=API_KEY),
                          capture_output=True, text=True, timeout=120)


def test_the_cli_reads_the_server(server: dict) -> None:
    listed = _cli(server, "list")
    assert listed.returncode == 0 and JOB_ID in listed.stdout and "running" in listed.stdout, listed.stderr
    got = _cli(server, "get")  # the server's only job
    assert got.returncode == 0 and json.loads(got.stdout)["id"] == JOB_ID, got.stderr
    events = _cli(server, "events", JOB_ID, "--limit", "5")
    assert events.returncode == 0 and len(events.stdout.strip().splitlines()) >= 5, events.stderr
    refused = subprocess.run([sys.executable, "-m", "deltaserve_core.cli", "jobs", "list", "--server",
                              server["base"], "--api-key", "wrong"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "401" in refused.stderr, refused.stderr


def _create_body(server: dict, **over: Any) -> dict:
    return {"model": server["model"], "training_file": "train.json", "suffix": "created",
            "hyperparameters": {"n_epochs": 1, "batch_size": 48},
            "deltaserve": {"max_length": 64, "buffer_tokens": 512, "slo": {"ttft_s": 5.0, "tpot_s": 1.0},
                           "checkpoint": {"every_steps": 2}, "publish": {"policy": "on_checkpoint"}}, **over}


def _create(server: dict, body: dict) -> tuple[int, Any]:
    return http_json("POST", f"{server['base']}/v1/fine_tuning/jobs", body, key=API_KEY)


def _ids(server: dict) -> list[str]:
    return _ops(server).ids()


def test_a_bad_create_is_refused_naming_the_field(server: dict) -> None:
    for over, status_code, param, words in (
            ({"model": "other-model"}, 400, "model", "'other-model' is not served here"),
            ({"training_file": "../data.json"}, 403, "training_file", "outside the server's data directory"),
            ({"training_file": "nope.json"}, 400, "training_file", "not a file"),
            ({"deltaserve": {"lora": {"rr": 4}}}, 400, "deltaserve.lora.rr", "did you mean 'r'"),
            ({"deltaserve": {"lora": {"r": 64}}}, 400, "deltaserve.lora.r", "--max-lora-rank"),
            ({"hyperparameters": {"n_epochs": 0}}, 400, "hyperparameters.n_epochs", "got 0")):
        status, body = _create(server, _create_body(server, **over))
        assert status == status_code and body["error"]["param"] == param, (over, body)
        assert words in body["error"]["message"], (over, body)
    assert _ids(server) == [JOB_ID]  # nothing started


def _ops(server: dict) -> JobsApi:
    return JobsApi(server["base"], API_KEY, lambda: None if server["proc"].poll() is None
                   else server["log"].read_text()[-4000:])


def test_a_second_job_trains_beside_the_first(server: dict) -> None:
    body = _create_body(server, suffix=SECOND, hyperparameters={"n_epochs": 200, "batch_size": 48})
    assert second_job_trains_beside_the_first(_ops(server), JOB_ID, body) == SECOND_ID
    _served(server)


def test_a_create_past_the_limit_is_refused(server: dict) -> None:
    past_the_limit_is_refused(_ops(server), _create_body(server, suffix="third"), [JOB_ID, SECOND_ID],
                              '"deltaserve".jobs.max_concurrent')
    assert not (Path(server["job"]).parent / "deltaserve-jobs" / "third").exists()  # nothing written


def test_pausing_one_job_leaves_the_other_training(server: dict) -> None:
    pause_one_the_other_trains(_ops(server), JOB_ID, SECOND_ID)
    _served(server)


def test_cancelling_the_other_ends_it_with_a_final_checkpoint(server: dict) -> None:
    job = cancel_the_other(_ops(server), SECOND_ID, JOB_ID)
    status, page = _api(server, "GET", f"/{SECOND_ID}/checkpoints")
    assert Path(page["data"][0]["fine_tuned_model_checkpoint"]).is_dir()
    held = job["trained_tokens"]
    _served(server)
    time.sleep(2.0)
    assert _job(server, SECOND_ID)["trained_tokens"] == held
    watch = _cli(server, "watch", SECOND_ID, "--interval", "0.5")  # an ended job: one line, then it returns
    assert watch.returncode == 0 and "cancelled" in watch.stdout, watch.stderr
    _served(server)


def test_metrics_show_each_job(server: dict) -> None:
    metrics_show_each_job(_ops(server), {JOB_ID: True, SECOND_ID: True})


def test_a_training_file_that_fails_to_load_fails_the_job_alone(server: dict) -> None:
    # the job file's job is paused (the two-jobs steps) and holds one of the two places; the failed job frees its
    preparation_failure_is_contained(_ops(server), _create_body(server, suffix="broken", training_file="uploaded.json"),
                                     {JOB_ID: "paused", SECOND_ID: "cancelled"},
                                     Path(server["job"]).parent / "deltaserve-jobs", lambda: _served(server))


def test_a_job_cancelled_while_validating_files_leaves_nothing_running(server: dict) -> None:
    cancel_while_validating_files(_ops(server), _create_body(server, suffix="early"), server["proc"].pid)
    _served(server)


def test_a_created_job_trains_publishes_and_succeeds(server: dict) -> None:
    status, job = _create(server, _create_body(server, metadata={"team": "search"}))
    assert status == 200 and job["id"] == "ftjob-created", job
    # answered at once: the dataset loads and the backward starts beside the engine's steps
    assert job["status"] == "validating_files" and job["metadata"] == {"team": "search"}, job
    assert job["hyperparameters"]["n_epochs"] == 1 and job["hyperparameters"]["batch_size"] == 48
    assert job["training_file"].endswith("data/train.json") and job["user_provided_suffix"] == "created"
    # neither a cancelled nor a failed job counts to the limit
    assert _ids(server) == [JOB_ID, SECOND_ID, "ftjob-broken", "ftjob-early", "ftjob-created"]
    _wait_for(server, lambda j: j["status"] != "validating_files", "the created job to start", job_id="ftjob-created")
    done = _wait_for(server, lambda j: j["status"] == "succeeded", "the created job to succeed",
                     job_id="ftjob-created")
    assert done["trained_tokens"] > 0 and done["fine_tuned_model"], done
    status, events = _api(server, "GET", "/ftjob-created/events?limit=1000")
    assert any("created over HTTP" in e["message"] for e in events["data"]), events
    status, body = _complete(server["base"], "created@latest", PROMPTS[1])  # its versions are served by name
    assert status == 200 and body["model"].startswith("created@v"), body
    # and so are the job file's, created before it (not only the newest job's)
    status, body = _complete(server["base"], "jobsapi@latest", PROMPTS[1])
    assert status == 200 and body["model"].startswith("jobsapi@v"), body
    status, listed = http_json("GET", f"{server['base']}/v1/models", key=API_KEY)
    names = {card["id"] for card in listed["data"]}
    assert status == 200 and {"created@latest", "jobsapi@latest", body["model"]} <= names, names
    _served(server)


def test_a_restarted_server_resumes_every_job_that_did_not_end(server: dict) -> None:
    created = _cli(server, "create", "--model", server["model"], "--training-file", "train.json", "--suffix",
                   "resumed", "--n-epochs", "200", "--batch-size", "48", "--metadata", "run=restart",
                   "--deltaserve", json.dumps({"max_length": 64, "buffer_tokens": 512, "checkpoint": {"every_steps": 3},
                                               "slo": {"ttft_s": 5.0, "tpot_s": 1.0}}), "--json")
    assert created.returncode == 0, created.stderr
    before = json.loads(created.stdout)
    assert before["id"] == "ftjob-resumed" and before["metadata"] == {"run": "restart"}, before
    # the ended jobs made room for it and are still answered for
    assert _ids(server) == [JOB_ID, SECOND_ID, "ftjob-broken", "ftjob-early", "ftjob-created", "ftjob-resumed"]
    assert _job(server, SECOND_ID)["status"] == "cancelled"
    trained = _wait_for(server, lambda j: j["deltaserve"]["step"] >= 3, "a checkpoint", job_id="ftjob-resumed")
    paused = _job(server)
    assert paused["status"] == "paused"
    _stop(server["proc"])  # SIGINT: the final checkpoints
    server.update(_start(server["job"], server["tiny_model"], server["command"], server["env"], "restart.log",
                         "--api-key", API_KEY))
    job = _wait_for(server, lambda j: j["status"] == "running", "the resumed job", job_id="ftjob-resumed")
    assert job["deltaserve"]["step"] >= trained["deltaserve"]["step"], (job, trained)
    assert job["created_at"] == before["created_at"] and job["metadata"] == {"run": "restart"}
    # the job file's job comes back paused, as the operator left it; the cancelled and the succeeded job stay ended,
    # and the job whose training file failed to load left nothing to start again
    assert _ids(server) == [JOB_ID, "ftjob-resumed"]
    again = _job(server)
    assert again["status"] == "paused" and again["deltaserve"]["step"] == paused["deltaserve"]["step"], again
    assert again["trained_tokens"] == paused["trained_tokens"], (again, paused)
    events = _api(server, "GET", "/ftjob-resumed/events?limit=1000")[1]["data"]
    assert any("resumed from the checkpoint" in e["message"] for e in events), events
    status, body = _api(server, "POST", f"/{JOB_ID}/resume")
    assert status == 200 and body["status"] == "running", body
    _wait_for(server, lambda j: j["trained_tokens"] > paused["trained_tokens"], "the first job training again")
    status, body = http_json("GET", f"{server['base']}/v1/fine_tuning/jobs")  # no key
    assert status == 401, body
    _served(server)


def test_a_server_stopped_while_a_job_is_prepared_leaves_no_process(server: dict) -> None:
    status, body = _api(server, "POST", "/ftjob-resumed/cancel")  # room for one more job
    assert status == 200, body
    _wait_for(server, lambda j: j["status"] == "cancelled", "cancelled", job_id="ftjob-resumed")
    status, job = _create(server, _create_body(server, suffix="late"))
    assert status == 200 and job["status"] == "validating_files", job
    proc = server["proc"]
    tree = process_tree(proc.pid)
    proc.send_signal(signal.SIGINT)  # while its dataset loads or its backward starts
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        _stop(proc)
        pytest.fail(f"the server did not stop within 120 s:\n{server['log'].read_text()[-4000:]}")
    deadline = time.monotonic() + 30
    while left := [p for p in tree if alive(p)]:
        assert time.monotonic() < deadline, f"left running after the stop: {left}"
        time.sleep(0.5)
    # not cancelled: the next start prepares it again
    home = Path(server["job"]).parent / "deltaserve-jobs" / "late"
    assert (home / "job.yaml").is_file()
    assert "ended" not in operator_state(load_job_config(home / "job.yaml")), home
