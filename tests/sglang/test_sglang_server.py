"""SGLang's own HTTP server (``python -m sglang.launch_server``) with DeltaServe: refusals before the model loads,
the API key on SGLang's adapter endpoints, and a clean stop that writes the final checkpoint (issue 20).

The server runs as an operator runs it: a subprocess in its own session, DeltaServe switched on only by
``DELTASERVE_JOB``; the served runs start it through ``deltaserve serve --host sglang``, which checks the job and
then *becomes* ``sglang.launch_server`` (exec), so what they check holds for both ways of starting it. Periodic checkpoints are off in the job, so the only checkpoint is the one the stop writes.
One engine at a time: the server starts, is stopped by SIGTERM to its main process (systemd, Kubernetes), starts
again (resuming from that checkpoint) and is stopped by SIGINT to its process group (Ctrl-C in a terminal).

The refusals start SGLang's launcher but never its scheduler. Their 10 s bound is measured from the end of
SGLang's own imports (the launcher's ``UserWarning`` line, printed right after them), which alone take 10-60 s
on this loaded 2-core machine and are not DeltaServe's to shorten.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from deltaserve_core.testing.servers import http_json, processes_with_env, wait_until_up

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
pytestmark = pytest.mark.skipif(not HAVE_SGLANG, reason="SGLang is not installed (bash scripts/setup_sglang.sh)")

API_KEY = "test-key-" + uuid.uuid4().hex
#: printed by sglang.launch_server's __main__ once its imports are done, before it loads plugins or parses args
_IMPORTS_DONE = "'python -m sglang.launch_server' is still supported"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(method: str, url: str, body: dict | None = None, key: str | None = API_KEY,
          timeout: float = 120.0) -> tuple[int, object]:
    return http_json(method, url, body, key=key, timeout=timeout)


def _write_job(root: Path, name: str, body: str = "", ckpt: str = "ckpt") -> Path:
    records = [{"instruction": f"Write one sentence about topic {i}.", "input": "",
                "output": f"Here is a short sentence about topic {i}, written plainly."} for i in range(60)]
    (root / "train.json").write_text(json.dumps(records))
    job = root / f"{name}.yaml"
    # epochs: more than both runs can train (a few hundred steps a minute here), or the restart could find the
    # job already finished, whatever the first run's stop timing left
    job.write_text("dataset: train.json\nadapter_name: stopper\nlora: {r: 8, alpha: 16}\nepochs: 1000\n"
                   "backward_batch_tokens: 96\nmax_length: 64\nbuffer_tokens: 512\nslo: {ttft_s: 5.0, tpot_s: 5.0}\n"
                   f"checkpoint: {{dir: {ckpt}, every_steps: 0, keep: 2}}\npublish: {{policy: on_checkpoint}}\n"
                   f"{body}")
    return job


def _env(job: Path, marker: str, profiles: Path) -> dict[str, str]:
    # PYTHONPATH carries the test shims (tests/sglang/conftest.py put them there); the marker finds every process
    # the server started, whatever its parentage
    return dict(os.environ, DELTASERVE_JOB=str(job), DELTASERVE_PROFILE_DIR=str(profiles), OMP_NUM_THREADS="1",
                SGLANG_USE_CPU_ENGINE="1", PYTHONUNBUFFERED="1", DELTASERVE_TEST_MARK=marker)


def _argv(model: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--device", "cpu",
            "--dtype", "float32", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
            "--enable-lora", "--lora-backend", "torch_native", "--max-lora-rank", "16",
            "--lora-target-modules", "q_proj", "k_proj", "v_proj", "o_proj", "--disable-overlap-schedule",
            "--skip-tokenizer-init", "--max-total-tokens", "8192", "--chunked-prefill-size", "1024",
            "--max-prefill-tokens", "1024", "--host", "127.0.0.1", "--port", str(port), "--log-level", "info",
            *extra]


def _procs_with(marker: str) -> list[int]:
    return processes_with_env(f"DELTASERVE_TEST_MARK={marker}")


class _Server:
    """One ``sglang.launch_server`` process; every output line is kept with the time it arrived."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.marker = env["DELTASERVE_TEST_MARK"]
        self.lines: list[tuple[float, str]] = []
        self.log = log
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, env=env, cwd=log.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log, "w") as f:
            for line in self.proc.stdout:
                self.lines.append((time.monotonic(), line))
                f.write(line)
                f.flush()

    def text(self) -> str:
        return "".join(line for _, line in self.lines)

    def first(self, needle: str) -> float | None:
        return next((t for t, line in self.lines if needle in line), None)

    def wait_exit(self, timeout: float) -> float:
        """Seconds from now until the process exited (it is killed, with its group, past ``timeout``)."""
        t0 = time.monotonic()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the server did not exit within {timeout:.0f} s:\n{self.text()[-4000:]}")
        self._reader.join(10)
        return time.monotonic() - t0

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in _procs_with(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)


# ---------------------------------------------------------------------------------------------- refusals


def _resume_case(root: Path) -> Path:
    import dataclasses

    import torch

    from deltaserve_core.adapter_state import LoraAdapterState
    from deltaserve_core.checkpoint import save_checkpoint
    from deltaserve_core.job_config import load_job_config
    from deltaserve_core.lora_spec import LoraConfigSpec
    from deltaserve_core.preflight import resume_fields

    old = load_job_config(_write_job(root, "resume-old", "", ckpt="ckpt-resume"))
    old = dataclasses.replace(old, lora=LoraConfigSpec(r=4, lora_alpha=16.0))
    t = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 64),
         "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(64, 4)}
    save_checkpoint(old.checkpoint.dir, LoraAdapterState("stopper", 3, old.lora, t), None, 3,
                    {"pool": {"epochs": old.epochs, "seed": old.seed}, "job": resume_fields(old)})
    return _write_job(root, "resume", "", ckpt="ckpt-resume")  # r: 8 now


@pytest.mark.parametrize("name, body, needle", [
    ("type-error", "seed: x\n", "seed"),
    ("bad-module", "", "nonexistent"),
    ("rank-above-max", "", "--max-lora-rank 32"),
    ("resume", None, "lora.r: is 8 but the checkpoint"),
])
def test_bad_job_is_refused_before_sglang_loads_the_model(tmp_path: Path, tiny_model: Path, name: str,
                                                          body: str | None, needle: str) -> None:
    if name == "resume":
        job = _resume_case(tmp_path)
    else:
        job = _write_job(tmp_path, name, body or "")
        text = job.read_text()
        if name == "bad-module":
            job.write_text(text.replace("lora: {r: 8, alpha: 16}",
                                        "lora: {r: 8, alpha: 16, target_modules: [q_proj, nonexistent]}"))
        elif name == "rank-above-max":
            job.write_text(text.replace("lora: {r: 8, alpha: 16}", "lora: {r: 32, alpha: 16}"))
    marker = uuid.uuid4().hex
    server = _Server(_argv(tiny_model, _free_port()), _env(job, marker, tmp_path / "profiles"),
                     tmp_path / f"{name}.log")
    server.wait_exit(600)  # SGLang's imports alone, on a loaded machine
    out = server.text()
    assert server.proc.returncode != 0, out[-3000:]
    imported = server.first(_IMPORTS_DONE)
    refused = server.first("DeltaServe refuses to start")
    assert imported is not None and refused is not None, out[-3000:]
    assert refused - imported <= 10.0, f"refused {refused - imported:.1f} s after SGLang's imports"
    line = next(line for _, line in server.lines if "DeltaServe refuses to start" in line)
    assert needle in line, line
    # the scheduler never started: no weights loaded, no process of this server left
    assert "Load weight" not in out and "co-serving started" not in out, out[-3000:]
    assert _procs_with(marker) == []


def test_preflight_checks_what_sglang_needs_without_sglang_running(tmp_path: Path, tiny_model: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks the refusals above do not reach, on stand-in server arguments (no process is started)."""
    from deltaserve_core.job_config import JobConfigError
    from deltaserve_sglang.serving import ENV_GRACE, ENV_JOB, preflight

    def args(**over: object) -> SimpleNamespace:
        base = dict(model_path=str(tiny_model), enable_lora=True, lora_paths=None, max_lora_rank=16,
                    lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], tp_size=1, pp_size=1, dp_size=1,
                    speculative_algorithm=None, api_key=None, admin_api_key=None)
        base.update(over)
        return SimpleNamespace(**base)

    monkeypatch.delenv(ENV_JOB, raising=False)
    assert preflight(args()) is None  # no job: SGLang as it is
    job = _write_job(tmp_path, "ok")
    monkeypatch.setenv(ENV_JOB, str(job))
    assert preflight(args()).adapter_name == "stopper"
    assert preflight(args(enable_lora=None, lora_paths=["a=/x"])) is not None  # --lora-paths turns LoRA on
    with pytest.raises(ValueError, match="--enable-lora"):
        preflight(args(enable_lora=None))
    with pytest.raises(ValueError, match="tp/pp/dp size 1"):
        preflight(args(tp_size=2))
    with pytest.raises(JobConfigError, match=r"--lora-target-modules"):
        preflight(args(lora_target_modules=["q_proj"]))
    monkeypatch.setenv(ENV_GRACE, "soon")
    with pytest.raises(ValueError, match=ENV_GRACE):
        preflight(args())
    monkeypatch.delenv(ENV_GRACE)
    job.write_text(job.read_text().replace("dataset: train.json", "dataset: missing.json"))
    with pytest.raises(JobConfigError, match="dataset"):
        preflight(args())
    (tmp_path / "train.json").rename(tmp_path / "missing.json")
    shutil.rmtree(tmp_path / "ckpt")  # made by the passing checks above
    (tmp_path / "ckpt").write_text("a file where the folder should be")
    with pytest.raises(JobConfigError, match=r"checkpoint\.dir"):
        preflight(args())


# ---------------------------------------------------------------------------------------------- a running server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[SimpleNamespace]:
    root = tmp_path_factory.mktemp("sglang-serve")
    job = _write_job(root, "job")
    state = SimpleNamespace(root=root, job=job, ckpt=root / "ckpt", model=tiny_model, profiles=root / "profiles",
                            server=None)
    yield state
    if state.server is not None and state.server.proc.poll() is None:
        state.server.kill()


def _launcher_argv(model: Path, job: Path, port: int) -> list[str]:
    """``deltaserve serve`` with this module's engine settings: the per-step budget and KV pool of :func:`_argv`, the
    rest the launcher's own (the calibration host's), SGLang's own options after ``--``."""
    return [sys.executable, "-m", "deltaserve_core.cli", "serve", "--host", "sglang", str(model), "--job", str(job),
            "--port", str(port), "--max-batch-tokens", "1024", "--option", "max_total_tokens=8192",
            "--api-key", API_KEY, "--", "--skip-tokenizer-init", "--log-level", "info"]


def test_deltaserve_serve_prints_sglangs_server_line_without_the_key(served: SimpleNamespace) -> None:
    port = _free_port()
    argv = _launcher_argv(served.model, served.job, port)
    engine_args = argv.index("--")
    done = subprocess.run([*argv[:engine_args], "--print-command", "--", "--skip-tokenizer-init"],
                          env=_env(served.job, uuid.uuid4().hex, served.profiles), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert API_KEY not in done.stdout + done.stderr
    words = shlex.split(done.stdout.strip().splitlines()[-1])
    assert words[:2] == [f"DELTASERVE_JOB={served.job.resolve()}", "SGLANG_USE_CPU_ENGINE=1"], words
    line = words[2:]
    assert line[:3] == ["python", "-m", "sglang.launch_server"] and line[-1] == "--skip-tokenizer-init", line
    for option, value in (("--model-path", str(served.model)), ("--device", "cpu"), ("--chunked-prefill-size", "1024"),
                          ("--max-total-tokens", "8192"), ("--port", str(port)), ("--api-key", "$DELTASERVE_API_KEY")):
        assert line[line.index(option) + 1] == value, (option, line)
    assert "--enable-lora" in line and "--disable-overlap-schedule" in line, line


def _start(state: SimpleNamespace, log_name: str) -> _Server:
    port = _free_port()
    marker = uuid.uuid4().hex
    server = _Server(_launcher_argv(state.model, state.job, port), _env(state.job, marker, state.profiles),
                     state.root / log_name)
    state.server, state.base = server, f"http://127.0.0.1:{port}"
    # the first start calibrates the scheduler in place (minutes on this machine); later ones load the profile
    why = wait_until_up(f"{state.base}/health", server.proc, 900, poll_s=2.0)
    if why:
        server.kill()
        pytest.fail(f"the server {why}:\n{server.text()[-4000:]}")
    return server


def _trained_steps(server: _Server) -> int:
    # the core's progress line: "fine-tuning: step N (M this run), loss ...", N the adapter's step (a resumed job
    # continues it), M this process's optimizer steps
    steps = [int(line.split("fine-tuning: step ", 1)[1].split()[0].rstrip(",")) for _, line in server.lines
             if "fine-tuning: step " in line]
    return max(steps, default=0)


def _wait_trained(server: _Server, more_than: int, timeout: float = 600) -> int:
    deadline = time.monotonic() + timeout
    while _trained_steps(server) <= more_than:
        assert server.proc.poll() is None, server.text()[-4000:]
        assert "fine-tuning finished" not in server.text(), f"the job ended before step {more_than + 1}"
        assert time.monotonic() < deadline, f"no optimizer step past {more_than}:\n{server.text()[-4000:]}"
        time.sleep(2)
    return _trained_steps(server)


def _checkpoint_steps(ckpt: Path) -> list[int]:
    from deltaserve_core.checkpoint import list_checkpoints

    return [int(p.name.split("-")[1]) for p in list_checkpoints(ckpt)]


def test_sglang_adapter_endpoints_need_the_api_key(served: SimpleNamespace, tiny_adapter: Path) -> None:
    """SGLang's own adapter endpoints (which would load
    DeltaServe's checkpoint folders by path) take the server's --api-key, and refuse without it."""
    _start(served, "server.log")
    base = served.base
    ckpt_path = str(served.ckpt)
    for key in (None, "wrong-" + API_KEY):
        for method, path, body in (("POST", "/load_lora_adapter", {"lora_name": "x", "lora_path": ckpt_path}),
                                   ("POST", "/unload_lora_adapter", {"lora_name": "x"}),
                                   ("GET", "/v1/models", None),
                                   ("POST", "/generate", {"input_ids": [5, 6, 7], "sampling_params": {
                                       "max_new_tokens": 2, "temperature": 0}})):
            status, reply = _http(method, base + path, body, key=key)
            assert status == 401, (key, path, status, reply)
    status, reply = _http("POST", f"{base}/generate", {"input_ids": [5, 6, 7], "sampling_params": {
        "max_new_tokens": 2, "temperature": 0}})
    assert status == 200, reply
    # with the key, the operator's own adapters still load (the way published versions are served under SGLang)
    status, reply = _http("POST", f"{base}/load_lora_adapter", {"lora_name": "client-a",
                                                                "lora_path": str(tiny_adapter)})
    assert status == 200, reply


def test_sigterm_writes_a_final_checkpoint_with_periodic_checkpoints_off(served: SimpleNamespace) -> None:
    server = served.server
    assert server is not None and server.proc.poll() is None, "runs after the API key test, on its server"
    trained = _wait_trained(server, 0)
    assert _checkpoint_steps(served.ckpt) == [], "periodic checkpoints are off in this job"
    server.proc.send_signal(signal.SIGTERM)  # the main process only, as systemd's or Kubernetes' stop does
    stopped_s = server.wait_exit(120)
    out = server.text()
    steps = _checkpoint_steps(served.ckpt)
    assert steps and steps[-1] >= trained, (steps, trained, out[-4000:])
    assert "DeltaServe final checkpoint" in out and "killing them before they released" not in out, out[-4000:]
    # SGLang drains (polling every 5 s) and waits up to shutdown_grace_s (30 s) for the scheduler
    assert stopped_s < 30 + 5 + 30, stopped_s
    assert _procs_with(server.marker) == [], "a process of the stopped server is still running"
    _assert_loads_as_peft(served, steps[-1])


def test_ctrl_c_after_a_restart_resumes_and_writes_a_newer_checkpoint(served: SimpleNamespace) -> None:
    before = _checkpoint_steps(served.ckpt)
    assert before, "runs after the SIGTERM test"
    server = _start(served, "restart.log")
    assert "resumed fine-tuning from checkpoint" in server.text(), server.text()[-4000:]
    _wait_trained(server, before[-1])  # the adapter's step: past the checkpoint this run resumed from
    os.killpg(server.proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: every process of the group gets it
    stopped_s = server.wait_exit(120)
    out = server.text()
    after = _checkpoint_steps(served.ckpt)
    assert after[-1] > before[-1], (before, after, out[-4000:])
    assert "DeltaServe final checkpoint" in out, out[-4000:]
    assert stopped_s < 30 + 5 + 30, stopped_s
    assert _procs_with(server.marker) == []
    _assert_loads_as_peft(served, after[-1])


def _assert_loads_as_peft(served: SimpleNamespace, step: int) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(served.model, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, served.ckpt / f"checkpoint-{step:08d}")
    assert any("lora_B" in n and p.abs().sum() > 0 for n, p in model.named_parameters())  # trained, not fresh


# ---------------------------------------------------------------------------------------------- metrics


def test_deltaserve_metrics_are_on_sglangs_own_metrics_endpoint(served: SimpleNamespace) -> None:
    """With ``--enable-metrics`` SGLang runs every process in prometheus_client's multiprocess mode: what DeltaServe
    records in the scheduler process is on the API server's ``/metrics``, beside SGLang's own metrics."""
    from deltaserve_core.metrics import JOB_LABEL
    from deltaserve_core.testing.metrics import assert_sane, parse_exposition

    # after the stop tests this start resumes, and publishes the resumed version again
    resumed_step = max(_checkpoint_steps(served.ckpt), default=0)
    port = _free_port()
    server = _Server(_argv(served.model, port, "--api-key", API_KEY, "--enable-metrics"),
                     _env(served.job, uuid.uuid4().hex, served.profiles), served.root / "metrics.log")
    base = f"http://127.0.0.1:{port}"
    try:
        why = wait_until_up(f"{base}/health", server.proc, 900, poll_s=2.0)
        assert why is None, f"the server {why}:\n{server.text()[-4000:]}"
        status, _ = _http("POST", f"{base}/generate", {"input_ids": [5, 6, 7], "sampling_params": {
            "max_new_tokens": 4, "temperature": 0}})
        assert status == 200
        job = ((JOB_LABEL, "stopper"),)
        deadline = time.monotonic() + 600
        while True:
            status, text = http_json("GET", f"{base}/metrics")  # open, as SGLang leaves it under --api-key
            assert status == 200 and isinstance(text, str), (status, text)
            series = parse_exposition(text)
            if series.get("deltaserve_optimizer_steps_total", {}).get(job, 0) >= 1:
                break
            assert server.proc.poll() is None, server.text()[-4000:]
            assert time.monotonic() < deadline, f"no optimizer step on /metrics:\n{server.text()[-4000:]}"
            time.sleep(2)
        assert_sane(series, "stopper", published=resumed_step > 0, multiprocess=True)
        assert any(name.startswith("sglang:") for name in series), sorted(series)[:20]  # SGLang's own stay
        # where the job is continues from the checkpoint; the counters count this process's work
        assert series["deltaserve_adapter_step"][job] >= resumed_step + 1
    finally:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
            server.wait_exit(120)
