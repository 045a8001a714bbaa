"""`deltaserve serve`: the operator path, as an operator runs it (a subprocess on a free 127.0.0.1 port).

Greedy outputs over HTTP equal the same host's outputs without DeltaServe; the job trains meanwhile and
``/metrics`` shows it (every DeltaServe metric, sane values); unsupported sampling is refused with a 400; SIGTERM finishes cleanly (exit 0) with a checkpoint on disk; a bad job file is a
one-line error (exit 2) before anything starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from deltaserve_core.driver import ClientRequest, HostConfig
from deltaserve_core.registry import create_host

_TOPICS = ["the sea", "a mountain", "bread", "rain", "the moon", "a river", "music", "trees"]
_PROMPTS = [(5, 6, 7, 8), (40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50), (300, 12, 99), (7,) * 20]
_STRING_PROMPT = "What is the capital of France?"
_MAX_TOKENS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(method: str, url: str, body: dict | None = None, timeout: float = 60.0,
          key: str | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from deltaserve_core.testing.tiny_model import build_tiny_llama

    root = tmp_path_factory.mktemp("serve")
    build_tiny_llama(root / "model")
    records = [{"instruction": f"Write one sentence about {t}.", "input": "",
                "output": f"Here is a short sentence about {t}, written plainly."} for t in _TOPICS * 3]
    (root / "train.json").write_text(json.dumps(records))
    return root


def _write_job(root: Path, name: str) -> Path:
    job = root / f"{name}.yaml"
    job.write_text(f"""dataset: train.json
adapter_name: {name}
max_length: 64
buffer_tokens: 512
backward_batch_tokens: 96
slo: {{ttft_s: 5.0, tpot_s: 5.0}}
checkpoint: {{dir: ckpt-{name}, every_steps: 2, keep: 2}}
publish: {{policy: on_checkpoint}}
""")
    return job


def _expected(host_name: str, model: Path) -> dict[object, tuple[int, ...]]:
    """Greedy outputs of the same host with DeltaServe not attached."""
    from transformers import AutoTokenizer

    string_ids = tuple(AutoTokenizer.from_pretrained(model)(_STRING_PROMPT)["input_ids"])
    host = create_host(host_name, HostConfig(model=str(model)))
    try:
        reqs = [ClientRequest(f"e{i}", p, _MAX_TOKENS, ignore_eos=False) for i, p in enumerate(_PROMPTS)]
        reqs.append(ClientRequest("s", string_ids, _MAX_TOKENS, ignore_eos=False))
        outs = host.generate(reqs)
    finally:
        host.shutdown()
    expected: dict[object, tuple[int, ...]] = {p: o.token_ids for p, o in zip(_PROMPTS, outs)}
    expected[_STRING_PROMPT] = outs[-1].token_ids
    return expected


class _Server:
    def __init__(self, root: Path, host: str, job: Path, key: str | None = None, *extra: str) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = root / f"serve-{host}.log"
        self.key = key  # sent by wait_ready; the caller passes it to its own requests
        env = dict(os.environ, OMP_NUM_THREADS="1", DELTASERVE_PROFILE_DIR=str(root / "profiles"))
        env.pop("DELTASERVE_API_KEY", None)
        if key is not None and "--api-key" not in extra:
            env["DELTASERVE_API_KEY"] = key
        self._log_fh = open(self.log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deltaserve_core.cli", "serve", "--host", host, str(root / "model"), "--job",
             str(job), "--port", str(self.port), "--host-addr", "127.0.0.1", "--log-every", "2", *extra],
            stdout=self._log_fh, stderr=subprocess.STDOUT, env=env, cwd=root)

    def output(self) -> str:
        self._log_fh.flush()
        return self.log.read_text()[-4000:]

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited with {self.proc.returncode}:\n{self.output()}"
            try:
                status, _ = _http("GET", f"{self.base}/v1/models", timeout=2.0, key=self.key)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"server not ready within {timeout} s:\n{self.output()}")

    def stop(self, timeout: float) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            self._log_fh.close()


def _complete_concurrently(base: str, prompts: list[object], **extra: object) -> list[tuple[int, dict]]:
    results: list[tuple[int, dict] | None] = [None] * len(prompts)

    def one(i: int) -> None:
        results[i] = _http("POST", f"{base}/v1/completions",
                           {"prompt": list(prompts[i]) if isinstance(prompts[i], tuple) else prompts[i],
                            "max_tokens": _MAX_TOKENS, "temperature": 0, **extra}, timeout=120.0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150.0)
    assert all(r is not None for r in results), "a completion request did not return"
    return results  # type: ignore[return-value]


def _wait_trained(base: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status, body = _http("GET", f"{base}/deltaserve/status", timeout=30.0)
        assert status == 200, body
        ft = body["finetune"]
        if ft["admitted_samples"] > 0 and ft["trained_tokens"] > 0:
            return body
        assert time.monotonic() < deadline, f"nothing trained within {timeout} s: {body}"
        time.sleep(0.5)


def _serve_flow(workdir: Path, host: str, prompts: list[object], ready_timeout: float) -> Path:
    expected = _expected(host, workdir / "model")
    job = _write_job(workdir, f"job-{host}")
    server = _Server(workdir, host, job)
    answer: list[tuple[int, dict]] = []
    long_request = threading.Thread(target=lambda: answer.append(_http(
        "POST", f"{server.base}/v1/completions", {"prompt": [9, 10, 11], "max_tokens": 120, "ignore_eos": True},
        timeout=150.0)))
    try:
        server.wait_ready(ready_timeout)
        base = server.base
        status, models = _http("GET", f"{base}/v1/models")
        assert status == 200 and models["data"][0]["id"] == str(workdir / "model")

        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(workdir / "model")
        for prompt, (status, body) in zip(prompts, _complete_concurrently(base, prompts)):
            assert status == 200, body
            choice = body["choices"][0]
            assert tuple(choice["token_ids"]) == expected[prompt], prompt
            assert choice["text"] == tok.decode(choice["token_ids"], skip_special_tokens=True)
            n_prompt = len(prompt) if isinstance(prompt, tuple) else len(tok(prompt)["input_ids"])
            assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": len(choice["token_ids"]),
                                     "total_tokens": n_prompt + len(choice["token_ids"])}

        # Greedy only, and the refusal says so; unknown models are a 404 naming what exists.
        status, body = _http("POST", f"{base}/v1/completions", {"prompt": [5, 6], "max_tokens": 2,
                                                                 "temperature": 0.7})
        assert status == 400 and "greedy" in body["error"]["message"], body
        status, body = _http("POST", f"{base}/v1/completions", {"prompt": [5, 6], "stream": True})
        assert status == 400 and "stream" in body["error"]["message"], body
        status, body = _http("POST", f"{base}/v1/completions", {"prompt": [5, 6], "model": "no-such-model"})
        assert status == 404, body
        status, body = _http("POST", f"{base}/v1/completions", {"prompt": [5, 6], "model": ["a"]})
        assert status == 400, body  # was a 500

        state = _wait_trained(base, timeout=180.0)
        assert state["inference"]["requests"] >= len(prompts)
        assert state["inference"]["slo_attainment"] is not None
        assert "fraction" in state["pool"] and "estimator_mape" in state

        # A published adapter version is listed and servable by name.
        deadline = time.monotonic() + 120.0
        while not state["published"] and time.monotonic() < deadline:
            time.sleep(0.5)
            state = _http("GET", f"{base}/deltaserve/status", timeout=30.0)[1]
        assert state["published"], f"no adapter published within the deadline: {state}"
        name = state["published"][-1]
        assert name in [m["id"] for m in _http("GET", f"{base}/v1/models")[1]["data"]]
        status, body = _http("POST", f"{base}/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3, "model": name})
        assert status == 200 and body["model"] == name, body
        # The job's adapter name serves its newest version: this one, or one published since (training goes on).
        status, body = _http("POST", f"{base}/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3,
                                                                 "model": f"job-{host}"})
        assert status == 200 and body["model"].startswith(f"job-{host}@v"), body
        assert int(body["model"].rsplit("@v", 1)[1]) >= int(name.rsplit("@v", 1)[1]), (body["model"], name)
        # ... and so does its @latest alias, listed with the versions
        assert f"job-{host}@latest" in [m["id"] for m in _http("GET", f"{base}/v1/models")[1]["data"]]
        status, latest = _http("POST", f"{base}/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3,
                                                                   "model": f"job-{host}@latest"})
        assert status == 200 and int(latest["model"].rsplit("@v", 1)[1]) >= int(body["model"].rsplit("@v", 1)[1])

        _assert_metrics(base, f"job-{host}")

        # SIGTERM with a request in flight: it is finished and answered before the server exits.
        long_request.start()
        deadline = time.monotonic() + 30.0
        while _http("GET", f"{base}/deltaserve/status")[1]["in_flight"] == 0 and not answer:
            assert time.monotonic() < deadline, "the long request never reached the engine"
            time.sleep(0.05)
    finally:
        rc = server.stop(timeout=180.0)
    if long_request.ident is not None:
        long_request.join(30.0)
    assert answer and answer[0][0] == 200 and len(answer[0][1]["choices"][0]["token_ids"]) == 120, answer
    assert rc == 0, server.output()
    out = server.log.read_text()
    assert "[serve] stopped:" in out and "final checkpoint" in out, out[-3000:]
    ckpts = sorted((workdir / f"ckpt-job-{host}").glob("checkpoint-*"))
    assert ckpts and (ckpts[-1] / "adapter_model.safetensors").is_file(), out[-3000:]
    assert str(ckpts[-1]) in out.split("[serve] stopped:")[-1], "the final checkpoint is not the newest one"
    return ckpts[-1]


def test_serve_reference(workdir: Path) -> None:
    final = _serve_flow(workdir, "reference", [*_PROMPTS, _STRING_PROMPT], ready_timeout=240.0)
    # A restart resumes from the final checkpoint and serves the adapter it holds; this time with an API key
    # (from DELTASERVE_API_KEY), which every endpoint but /health requires.
    key = "k-" + os.urandom(8).hex()
    server = _Server(workdir, "reference", workdir / "job-reference.yaml", key)
    try:
        server.wait_ready(240.0)
        _assert_key_required(server.base, key)
        step = int(final.name.split("-")[-1])
        names = [m["id"] for m in _http("GET", f"{server.base}/v1/models", key=key)[1]["data"]]
        assert f"job-reference@v{step}" in names, names
        # every published version kept on disk (the newest checkpoint.keep) is served again
        on_disk = sorted(p.name for p in (workdir / "ckpt-job-reference" / "published").iterdir()
                         if not (p / ".retired").exists())
        assert 0 < len(on_disk) <= 2 and set(on_disk) <= set(names), (on_disk, names)
        status, body = _http("POST", f"{server.base}/v1/completions",
                             {"prompt": [5, 6], "max_tokens": 1, "model": on_disk[0]}, key=key)
        assert status == 200, body

        # 64 clients connecting at once are all answered (the stdlib backlog of 5 dropped a fifth of them)
        start = threading.Barrier(64)
        results: list[tuple[int, dict]] = []

        def one(i: int) -> None:
            start.wait(30)
            results.append(_http("POST", f"{server.base}/v1/completions",
                                 {"prompt": [5 + i % 50, 6], "max_tokens": 1}, timeout=120.0, key=key))

        clients = [threading.Thread(target=one, args=(i,)) for i in range(64)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(150.0)
        assert len(results) == 64 and all(code == 200 for code, _ in results), [c for c, _ in results]
        state = _http("GET", f"{server.base}/deltaserve/status", key=key)[1]
        assert state["pool"]["samples_completed"] > 0, state
        # with the key; this process republished the resumed adapter, and may have had nothing left to train
        _assert_metrics(server.base, "job-reference", key, trained=False)
    finally:
        rc = server.stop(timeout=180.0)
    assert rc == 0, server.output()
    assert key not in server.log.read_text()  # the key is never logged


def _assert_metrics(base: str, job: str, key: str | None = None, **expect: bool) -> None:
    """GET /metrics: every DeltaServe metric in Prometheus' text format, with sane values (``expect``: what
    :func:`~deltaserve_core.testing.metrics.assert_sane` may assume; by default a trained, published job)."""
    from deltaserve_core.testing.metrics import assert_sane, parse_exposition

    req = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain"), resp.headers
        assert_sane(parse_exposition(resp.read().decode()), job, **expect)


def _assert_key_required(base: str, key: str) -> None:
    """Without the key (or with another) every endpoint that serves or shows the job is a 401 that reveals
    nothing, not even whether the path exists; /health stays open for load balancers."""
    asks = [("POST", "/v1/completions", {"prompt": [5, 6], "max_tokens": 1}), ("GET", "/v1/models", None),
            ("GET", "/deltaserve/status", None), ("GET", "/metrics", None), ("GET", "/no/such/path", None),
            ("POST", "/v1/chat/completions", {})]
    for wrong in (None, "wrong", key + "x", key[:-1], f"Basic {key}"):
        for method, path, body in asks:
            if wrong is not None and wrong.startswith("Basic "):
                req = urllib.request.Request(base + path, method=method, headers={"Authorization": wrong},
                                             data=None if body is None else json.dumps(body).encode())
                try:
                    urllib.request.urlopen(req, timeout=30)
                    status, reply = 200, {}
                except urllib.error.HTTPError as err:
                    status, reply = err.code, json.loads(err.read())
            else:
                status, reply = _http(method, base + path, body, key=wrong)
            assert status == 401, (wrong, path, status, reply)
            assert reply["error"]["type"] == "authentication_error" and "job" not in json.dumps(reply), reply
    assert _http("GET", f"{base}/health")[0] == 200
    status, body = _http("POST", f"{base}/v1/completions", {"prompt": [5, 6], "max_tokens": 1}, key=key)
    assert status == 200, body
    assert _http("GET", f"{base}/deltaserve/status", key=key)[0] == 200


@pytest.mark.slow
def test_serve_vllm(workdir: Path) -> None:
    if importlib.util.find_spec("vllm") is None and not os.environ.get("DELTASERVE_REQUIRE_ENGINES"):
        pytest.skip("vLLM is not installed (pip install 'deltaserve[vllm]')")
    _serve_flow(workdir, "vllm", [_PROMPTS[0], _PROMPTS[1]], ready_timeout=480.0)


def test_bad_job_and_missing_model_exit_2(workdir: Path) -> None:
    bad = workdir / "bad.yaml"
    bad.write_text("dataset: train.json\nepochs: 0\n")
    missing = workdir / "missing-data.yaml"
    missing.write_text("dataset: nowhere.json\n")
    cases = [(["--job", str(bad), str(workdir / "model")], "epochs"),
             (["--job", str(missing), str(workdir / "model")], "nowhere.json"),
             (["--job", str(_write_job(workdir, "ok")), str(workdir / "no-model")], "no-model")]
    for extra, needle in cases:
        proc = subprocess.run([sys.executable, "-m", "deltaserve_core.cli", "serve", "--host", "reference",
                               "--port", str(_free_port()), *extra], capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("deltaserve serve:") and needle in lines[0], proc.stderr
