"""The fine-tuning jobs API in SGLang's own HTTP server (``/v1/fine_tuning/jobs``), against a real
``python -m sglang.launch_server`` with ``DELTASERVE_JOB``, ``--api-key`` and ``--enable-metrics``: the same routes,
JSON and errors as under ``vllm serve`` (tests/test_vllm_jobs_api.py).

One module-scoped server (API server and scheduler in separate processes, as in production), running a job long
enough not to end by itself, with a checkpoint every 3 steps, a data directory for jobs created over HTTP
(``DELTASERVE_JOBS_DATA_DIR``) and room for two jobs (``DELTASERVE_JOBS_MAX_CONCURRENT=2``). The tests run in file
order on it: the key is needed; list and get show the job training; pause holds the trained tokens (compared across
polls, never timed) and resume moves them again; events and checkpoints page newest first. Then the operator's two
jobs: a second job created over HTTP trains beside the first, a third is refused (the limit), pausing the first
holds its trained tokens (API and /metrics) while the second's grow, cancelling the second ends it, /metrics shows
each job's series; bad creates are refused naming the field (a symlink out of the data directory among them); a
training file that fails to load fails that job alone after the create answered ``validating_files``, a job
cancelled while validating files leaves no process behind; a created job trains and succeeds in the room the
cancelled one left. The server is stopped and started again with
the same environment: the paused job comes back paused at its step, alone (the ended jobs stay ended), and trains
once resumed; a request without the key is refused. Last, the server is started without a job file (a fresh jobs
folder, the calibration the first start stored): it starts with no job, and a create starts one. Client requests
are served throughout.

The last tests mount the routes in this process, on SGLang's own app and key middleware, for what one server with
one key cannot show: the admin key on the control routes, and the warnings of a server without a key or with
several tokenizer workers.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from types import SimpleNamespace
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from test_sglang_server import API_KEY, HAVE_SGLANG, _argv, _env, _free_port, _http, _Server
from deltaserve_core.testing.servers import wait_until_up
from deltaserve_core.testing.two_jobs import (JobsApi, cancel_the_other, cancel_while_validating_files,
                                            metrics_show_each_job, past_the_limit_is_refused,
                                            pause_one_the_other_trains, preparation_failure_is_contained,
                                            second_job_trains_beside_the_first, unloadable_training_file)

pytestmark = pytest.mark.skipif(not HAVE_SGLANG, reason="SGLang is not installed (bash scripts/setup_sglang.sh)")

JOB_ID = "ftjob-sgjobs"
SECOND = "second"
SECOND_ID = f"ftjob-{SECOND}"


def _write_job(root: Path) -> Path:
    records = [{"instruction": f"Write one sentence about topic {i}.", "input": "",
                "output": f"Here is a short sentence about topic {i}, written plainly."} for i in range(60)]
    (root / "train.json").write_text(json.dumps(records))
    (root / "data").mkdir()
    (root / "data" / "train.json").write_text(json.dumps(records[:16]))
    (root / "secret.json").write_text(json.dumps(records))
    (root / "data" / "link.json").symlink_to(root / "secret.json")  # inside the folder, pointing out of it
    unloadable_training_file(root / "train.json", root / "data" / "uploaded.json")
    job = root / "job.yaml"
    job.write_text("dataset: train.json\nadapter_name: sgjobs\nlora: {r: 8, alpha: 16}\nepochs: 1000\n"
                   "backward_batch_tokens: 96\nmax_length: 64\nbuffer_tokens: 512\nslo: {ttft_s: 5.0, tpot_s: 5.0}\n"
                   "checkpoint: {dir: ckpt, every_steps: 3, keep: 50}\npublish: {policy: on_checkpoint}\n")
    return job


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("sglang-jobs-api")
    job = _write_job(root)
    env = dict(_env(job, uuid.uuid4().hex, root / "profiles"), DELTASERVE_JOBS_DATA_DIR=str(root / "data"),
               DELTASERVE_JOBS_DIR=str(root / "jobs"), DELTASERVE_JOBS_MAX_CONCURRENT="2")
    info = {"root": root, "model": str(tiny_model), "env": env}
    _start(info, env, "server.log")
    yield info
    if info["server"].proc.poll() is None:
        info["server"].kill()


def _start(info: dict, env: dict[str, str], log_name: str) -> None:
    port = _free_port()
    proc = _Server(_argv(Path(info["model"]), port, "--api-key", API_KEY, "--enable-metrics"), env,
                   info["root"] / log_name)
    base = f"http://127.0.0.1:{port}"
    why = wait_until_up(f"{base}/health", proc.proc, 900, poll_s=2.0)
    if why:
        proc.kill()
        pytest.fail(f"the server {why}:\n{proc.text()[-4000:]}")
    info.update(base=base, server=proc)


def _api(server: dict, method: str, path: str, key: str | None = API_KEY) -> tuple[int, Any]:
    return _http(method, f"{server['base']}/v1/fine_tuning/jobs{path}", key=key)


def _job(server: dict, job_id: str = JOB_ID) -> dict:
    status, body = _api(server, "GET", f"/{job_id}")
    assert status == 200, body
    return body


def _wait_for(server: dict, cond: Callable[[dict], bool], what: str, timeout: float = 600.0,
              job_id: str = JOB_ID) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = _job(server, job_id)
        if cond(job):
            return job
        assert server["server"].proc.poll() is None, server["server"].text()[-4000:]
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s; job: {json.dumps(job)[:2000]}"
        time.sleep(1.0)


def _served(server: dict) -> None:
    status, reply = _http("POST", f"{server['base']}/generate", {"input_ids": [5, 6, 7], "sampling_params": {
        "max_new_tokens": 4, "temperature": 0}})
    assert status == 200 and len(reply["output_ids"]) == 4, reply


def test_every_route_needs_the_api_key(server: dict) -> None:
    for method, path in (("GET", ""), ("GET", f"/{JOB_ID}"), ("POST", f"/{JOB_ID}/pause"),
                         ("POST", f"/{JOB_ID}/resume"), ("POST", f"/{JOB_ID}/cancel"),
                         ("GET", f"/{JOB_ID}/events"), ("GET", f"/{JOB_ID}/checkpoints"), ("POST", "")):
        for key in (None, "wrong-" + API_KEY):
            status, body = _api(server, method, path, key=key)
            assert status == 401, (method, path, key is None, body)
    status, listed = _api(server, "GET", "")
    assert status == 200 and listed["object"] == "list", listed
    assert _job(server)["status"] in ("validating_files", "queued", "running")  # the refused cancel did nothing


def test_list_and_get_show_the_job_training(server: dict) -> None:
    job = _wait_for(server, lambda j: j["trained_tokens"] > 0, "a trained token")
    assert job["object"] == "fine_tuning.job" and job["id"] == JOB_ID and job["status"] == "running"
    assert job["training_file"].endswith("train.json") and job["hyperparameters"]["n_epochs"] == 1000
    assert job["deltaserve"]["lora"]["r"] == 8
    status, listed = _api(server, "GET", "")
    assert status == 200 and listed["has_more"] is False and [j["id"] for j in listed["data"]] == [JOB_ID]
    status, body = _api(server, "GET", "?limit=x")
    assert status == 400 and body["error"]["param"] == "limit", body
    status, body = _api(server, "GET", "/ftjob-nope")
    assert status == 404 and body["error"]["code"] == "job_not_found" and body["error"]["param"] == "id", body
    _served(server)


def _create_body(server: dict, **over: Any) -> dict:
    return {"model": server["model"], "training_file": "train.json", "suffix": "made",
            "hyperparameters": {"n_epochs": 1, "batch_size": 96},
            "deltaserve": {"max_length": 64, "buffer_tokens": 512, "slo": {"ttft_s": 5.0, "tpot_s": 5.0},
                           "checkpoint": {"every_steps": 2}}, **over}


def _create(server: dict, body: dict) -> tuple[int, Any]:
    return _http("POST", f"{server['base']}/v1/fine_tuning/jobs", body, key=API_KEY)


def test_pause_holds_training_and_resume_restarts_it(server: dict) -> None:
    status, body = _api(server, "POST", f"/{JOB_ID}/pause")
    assert status == 200 and body["status"] == "paused", body
    job = _wait_for(server, lambda j: not j["deltaserve"]["backward_busy"], "the running batch to land")
    held = job["trained_tokens"]
    for _ in range(3):  # polls a second apart, with client requests in between
        _served(server)
        time.sleep(1.0)
        job = _job(server)
        assert job["status"] == "paused" and job["trained_tokens"] == held, job
    status, body = _api(server, "POST", f"/{JOB_ID}/pause")
    assert status == 200 and body["status"] == "paused" and body["trained_tokens"] == held, body  # idempotent
    status, body = _api(server, "POST", f"/{JOB_ID}/resume")
    assert status == 200 and body["status"] == "running", body
    _wait_for(server, lambda j: j["trained_tokens"] > held, "training after resume")


def test_events_are_paged_newest_first(server: dict) -> None:
    status, first = _api(server, "GET", f"/{JOB_ID}/events?limit=2")
    assert status == 200 and first["object"] == "list" and len(first["data"]) == 2 and first["has_more"], first
    status, second = _api(server, "GET", f"/{JOB_ID}/events?limit=2&after={first['data'][-1]['id']}")
    assert status == 200 and second["data"], second
    ids = [int(e["id"].split("-")[1]) for e in first["data"] + second["data"]]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)
    status, every = _api(server, "GET", f"/{JOB_ID}/events?limit=1000")
    messages = [e["message"] for e in every["data"]]
    assert any("paused by the operator" in m for m in messages) and any("resumed by" in m for m in messages)
    status, body = _api(server, "GET", f"/{JOB_ID}/events?limit=0")
    assert status == 400 and body["error"]["param"] == "limit", body


def test_checkpoints_are_paged_newest_first(server: dict) -> None:
    job = _wait_for(server, lambda j: j["deltaserve"]["step"] >= 6, "two checkpoints")
    status, first = _api(server, "GET", f"/{JOB_ID}/checkpoints?limit=1")
    assert status == 200 and len(first["data"]) == 1 and first["has_more"], (first, job)
    status, second = _api(server, "GET", f"/{JOB_ID}/checkpoints?limit=1&after={first['data'][0]['id']}")
    assert status == 200 and len(second["data"]) == 1, second
    newer, older = first["data"][0], second["data"][0]
    assert newer["object"] == "fine_tuning.job.checkpoint" and newer["step_number"] > older["step_number"]
    assert newer["step_number"] % 3 == 0 and older["step_number"] % 3 == 0
    assert Path(newer["fine_tuned_model_checkpoint"]).is_dir() and "train_loss" in newer["metrics"]
    status, body = _api(server, "GET", f"/{JOB_ID}/checkpoints?after=ftckpt-nope")
    assert status == 400 and body["error"]["code"] == "invalid_cursor", body


def _ops(server: dict) -> JobsApi:
    return JobsApi(server["base"], API_KEY, lambda: None if server["server"].proc.poll() is None
                   else server["server"].text()[-4000:])


def _ids(server: dict) -> list[str]:
    return _ops(server).ids()


def test_a_second_job_trains_beside_the_first(server: dict) -> None:
    body = _create_body(server, suffix=SECOND, hyperparameters={"n_epochs": 1000, "batch_size": 96})
    assert second_job_trains_beside_the_first(_ops(server), JOB_ID, body) == SECOND_ID
    _served(server)


def test_a_create_past_the_limit_is_refused(server: dict) -> None:
    past_the_limit_is_refused(_ops(server), _create_body(server, suffix="third"), [JOB_ID, SECOND_ID],
                              "DELTASERVE_JOBS_MAX_CONCURRENT")
    assert not (server["root"] / "jobs" / "third").exists()  # nothing written


def test_pausing_one_job_leaves_the_other_training(server: dict) -> None:
    pause_one_the_other_trains(_ops(server), JOB_ID, SECOND_ID)
    _served(server)


def test_cancelling_the_other_ends_it(server: dict) -> None:
    cancel_the_other(_ops(server), SECOND_ID, JOB_ID)
    _served(server)


def test_metrics_show_each_job(server: dict) -> None:
    series = metrics_show_each_job(_ops(server), {JOB_ID: True, SECOND_ID: False}, multiprocess=True)
    assert any(name.startswith("sglang:") for name in series)  # SGLang's own stay


def test_a_bad_create_is_refused_naming_the_field(server: dict) -> None:
    for over, status_code, param, words in (
            ({"model": "other-model"}, 400, "model", "'other-model' is not served here"),
            ({"training_file": "link.json"}, 403, "training_file", "outside the server's data directory"),
            ({"training_file": "../secret.json"}, 403, "training_file", "outside the server's data directory"),
            ({"deltaserve": {"optimizer": {"lr": -1}}}, 400, "deltaserve.optimizer.lr", "got -1"),
            ({"deltaserve": {"lora": {"target_modules": ["gate_proj"]}}}, 400, "deltaserve.lora.target_modules",
             "--lora-target-modules")):
        status, body = _create(server, _create_body(server, **over))
        assert status == status_code and body["error"]["param"] == param, (over, body)
        assert words in body["error"]["message"], (over, body)
    assert _ids(server) == [JOB_ID, SECOND_ID]  # nothing started


def test_a_training_file_that_fails_to_load_fails_the_job_alone(server: dict) -> None:
    preparation_failure_is_contained(_ops(server), _create_body(server, suffix="broken", training_file="uploaded.json"),
                                     {JOB_ID: "paused", SECOND_ID: "cancelled"}, server["root"] / "jobs",
                                     lambda: _served(server))


def test_a_job_cancelled_while_validating_files_leaves_nothing_running(server: dict) -> None:
    cancel_while_validating_files(_ops(server), _create_body(server, suffix="early"), server["server"].proc.pid)
    _served(server)


def test_a_created_job_trains_and_succeeds(server: dict) -> None:
    status, job = _create(server, _create_body(server, metadata={"k": "v"}))
    assert status == 200 and job["id"] == "ftjob-made" and job["metadata"] == {"k": "v"}, job
    assert job["status"] == "validating_files", job  # answered before its dataset loads
    # neither a cancelled nor a failed job counts to the limit
    assert _ids(server) == [JOB_ID, SECOND_ID, "ftjob-broken", "ftjob-early", "ftjob-made"]
    done = _wait_for(server, lambda j: j["status"] == "succeeded", "the created job to succeed", job_id="ftjob-made")
    assert done["trained_tokens"] > 0 and done["deltaserve"]["step"] > 0, done
    _served(server)


def test_a_restarted_server_resumes_the_paused_job_paused(server: dict) -> None:
    paused = _job(server)
    assert paused["status"] == "paused"
    server["server"].proc.send_signal(signal.SIGTERM)  # as an operator stops it: the final checkpoints
    assert server["server"].wait_exit(120) is not None, server["server"].text()[-4000:]
    _start(server, server["env"], "restart.log")
    assert _ids(server) == [JOB_ID]  # the cancelled, failed and succeeded jobs are not started again
    again = _job(server)
    assert again["status"] == "paused" and again["deltaserve"]["step"] == paused["deltaserve"]["step"], again
    status, body = _api(server, "POST", f"/{JOB_ID}/resume")
    assert status == 200 and body["status"] == "running", body
    _wait_for(server, lambda j: j["trained_tokens"] > paused["trained_tokens"], "training again after the restart")
    events = _api(server, "GET", f"/{JOB_ID}/events?limit=1000")[1]["data"]
    assert any("resumed from the checkpoint" in e["message"] for e in events), events
    status, body = _api(server, "GET", "", key=None)
    assert status == 401, body
    _served(server)


def test_a_server_started_without_a_job_creates_one(server: dict) -> None:
    server["server"].kill()
    env = {k: v for k, v in server["env"].items() if k != "DELTASERVE_JOB"}
    env["DELTASERVE_JOBS_DIR"] = str(server["root"] / "jobs-2")
    _start(server, env, "no-job.log")
    status, listed = _api(server, "GET", "")
    assert status == 200 and listed["data"] == [], listed
    status, job = _create(server, _create_body(server, suffix="first"))
    assert status == 200 and job["id"] == "ftjob-first", job
    _wait_for(server, lambda j: j["trained_tokens"] > 0, "training", job_id="ftjob-first")
    _served(server)


# ------------------------------------------------------------------------ in this process, on SGLang's own app

def _args(**over: Any) -> SimpleNamespace:
    return SimpleNamespace(**{"api_key": None, "admin_api_key": None, "tokenizer_worker_num": 1, **over})


def test_no_key_and_several_tokenizer_workers_are_warned(caplog: pytest.LogCaptureFixture) -> None:
    from sglang.srt.entrypoints import http_server

    from deltaserve_sglang.jobs_api import attach_http_routes

    def jobs_routes() -> list[str]:
        return [r.path for r in http_server.app.router.routes if "/fine_tuning/" in getattr(r, "path", "")]

    with caplog.at_level(logging.WARNING, logger="deltaserve.sglang"):
        assert attach_http_routes(_args(tokenizer_worker_num=2)) is False
    assert "--tokenizer-worker-num" in caplog.text and jobs_routes() == []
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="deltaserve.sglang"):
        assert attach_http_routes(_args()) is True
    assert "without an API key" in caplog.text and f"/v1/fine_tuning/jobs/{{job_id}}/cancel" in jobs_routes()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="deltaserve.sglang"):
        assert attach_http_routes(_args(api_key="k")) is True  # mounted once, whoever calls again
    assert caplog.text == "" and len(jobs_routes()) == 8


def test_with_an_admin_key_the_controls_need_it() -> None:
    from sglang.srt.entrypoints import http_server
    from sglang.srt.utils.auth import add_api_key_middleware
    from starlette.testclient import TestClient

    from deltaserve_sglang.jobs_api import attach_http_routes

    attach_http_routes(_args(api_key="client", admin_api_key="admin"))
    add_api_key_middleware(http_server.app, api_key="client", admin_api_key="admin")
    client = TestClient(http_server.app)  # no lifespan: no scheduler behind it, so a call that passes auth is a 503

    def status(method: str, path: str, key: str) -> int:
        return client.request(method, f"/v1/fine_tuning/jobs{path}", headers={"Authorization": f"Bearer {key}"}
                              ).status_code

    for op in ("pause", "resume", "cancel"):
        assert status("POST", f"/{JOB_ID}/{op}", "client") == 401
        assert status("POST", f"/{JOB_ID}/{op}", "admin") == 503
    assert status("POST", "", "client") == 401  # create changes the server's state too
    assert status("POST", "", "admin") == 400  # past auth, refused for its missing body
    for path in ("", f"/{JOB_ID}", f"/{JOB_ID}/events", f"/{JOB_ID}/checkpoints"):
        assert status("GET", path, "client") == 503
        assert status("GET", path, "nope") == 401
