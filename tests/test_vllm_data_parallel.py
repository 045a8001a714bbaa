"""One fine-tuning job over vLLM's own data parallelism: ``vllm serve ... --data-parallel-size 2``, as an operator
starts it.

vLLM runs one EngineCore process per data-parallel rank (and, by default, one API server per rank in front of a
load-balancing client); DeltaServe runs one rank of the job in each EngineCore, with vLLM's rank, the world size
and the store's address taken from the engine (the job file has no ``world_size`` or ``rendezvous``). The module
calibrates the tiny model, starts one such server with the jobs routes on, and checks: clients get greedy outputs
equal to plain vLLM's while the job trains, whichever engine serves them; a published version is served by name
from both engines; both ranks train and the jobs API shows each rank's progress and the total; every epoch's
samples are trained once each over the ranks; the ranks' adapters are bit-identical at every checkpointed global
step, and so is the version published for that step (both ranks publish into one folder).

The fast tests at the top check, without a server, how the job's ``data_parallel`` section is settled against the
engine and refused when it disagrees, and how the ranks' jobs-API answers are merged.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deltaserve_core.data_parallel import for_engine
from deltaserve_core.job_config import JobConfigError, job_config_from_mapping
from deltaserve_core.job_control import merge_rank_answers
from deltaserve_core.testing.servers import http_json
from test_vllm_serve import (  # noqa: F401  (calibrated, plain_outputs: fixtures, resolved against this module's job)
    API_KEY,
    HAVE_VLLM,
    PROMPTS,
    _complete,
    _env,
    _scrape,
    _start,
    calibrated,
    plain_outputs,
    write_job,
)

pytestmark = [pytest.mark.data_parallel,
              pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install 'deltaserve[vllm]')")]

ADAPTER = "dpjob"
JOB_ID = f"ftjob-{ADAPTER}"
SAMPLES = 24  # write_job's records
EPOCHS = 40  # long enough for the first client requests to run beside fine-tuning rows (3 took ~3 s here)


# ---------------------------------------------------------------------------------------------- no server


def _job(tmp_path: Path, every_steps: int = 2, **data_parallel: Any) -> Any:
    base = {"dataset": "d.json", "checkpoint": {"dir": str(tmp_path), "every_steps": every_steps}}
    return job_config_from_mapping({**base, "data_parallel": data_parallel} if data_parallel else base)


def test_the_engines_data_parallelism_is_taken_or_refused_naming_the_key(tmp_path: Path) -> None:
    flag = "--data-parallel-size"
    # no data_parallel section: world size and rendezvous come from the engine, the rest keeps its defaults
    derived = for_engine(_job(tmp_path), 2, rendezvous="127.0.0.1:29999", flag=flag).data_parallel
    assert (derived.world_size, derived.rendezvous, derived.claim_samples) == (2, "127.0.0.1:29999", 16)
    # the file's own settings are kept, its rendezvous wins over the engine's
    named = for_engine(_job(tmp_path, world_size=2, rendezvous="node0:1234", claim_samples=4), 2,
                       rendezvous="127.0.0.1:29999", flag=flag).data_parallel
    assert (named.world_size, named.rendezvous, named.claim_samples) == (2, "node0:1234", 4)
    # an engine without data parallelism leaves the job as the file says (separate servers, DELTASERVE_DP_RANK)
    alone = _job(tmp_path, world_size=3, rendezvous="node0:1234")
    assert for_engine(alone, 1, rendezvous=None, flag=flag) is alone
    with pytest.raises(JobConfigError, match=r"data_parallel\.world_size is 3.*--data-parallel-size 2.*set "
                                             r"data_parallel\.world_size to 2 or leave it out"):
        for_engine(_job(tmp_path, world_size=3, rendezvous="node0:1234"), 2, rendezvous="127.0.0.1:1", flag=flag)
    with pytest.raises(JobConfigError, match=r"data_parallel\.rendezvous: required with --data-parallel-size 4"):
        for_engine(_job(tmp_path), 4, rendezvous=None, flag=flag)  # replicas on several nodes
    with pytest.raises(JobConfigError, match=r"checkpoint\.every_steps \(0.*data parallelism from "
                                             r"--data-parallel-size 2"):
        for_engine(_job(tmp_path, every_steps=0), 2, rendezvous="127.0.0.1:1", flag=flag)


def _vllm_config(job_path: Path, size: int, *, local: int | None = None, moe: bool = False) -> Any:
    """The parts of a VllmConfig the plugin reads once vLLM has built it."""
    parallel = SimpleNamespace(data_parallel_size=size, data_parallel_size_local=local or size,
                               data_parallel_master_ip="127.0.0.1", local_engines_only=False)
    return SimpleNamespace(parallel_config=parallel, model_config=SimpleNamespace(is_moe=moe),
                           additional_config={"deltaserve": {"job": str(job_path)}})


def test_the_plugin_settles_data_parallelism_before_any_engine_starts(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from deltaserve_vllm.plugin import DATA_PARALLEL_KEY, configure_data_parallel

    job = write_job(tmp_path, adapter="dpunit", epochs=1, checkpoint="{dir: ckpt, every_steps: 2}",
                    publish="{policy: never}")
    config = _vllm_config(job, 2)
    configure_data_parallel(config)
    dp = config.additional_config["deltaserve"][DATA_PARALLEL_KEY]
    host, _, port = dp["rendezvous"].rpartition(":")
    assert dp["world_size"] == 2 and host == "127.0.0.1" and 0 < int(port) < 65536
    # the API servers vLLM spawns after the EngineCores started build their own config: nothing to settle there
    spawned = _vllm_config(job, 2)
    spawned.parallel_config.__dict__.update(_api_process_count=2, _api_process_rank=1)
    configure_data_parallel(spawned)
    assert DATA_PARALLEL_KEY not in spawned.additional_config["deltaserve"]
    configure_data_parallel(single := _vllm_config(job, 1))
    assert DATA_PARALLEL_KEY not in single.additional_config["deltaserve"]
    (tmp_path / "separate").mkdir()
    separate = write_job(tmp_path / "separate", adapter="dpunit", epochs=1, checkpoint="{dir: ckpt, every_steps: 2}",
                         publish="{policy: never}")
    with open(separate, "a") as f:  # one of several `vllm serve` processes: each needs its DELTASERVE_DP_RANK
        f.write("data_parallel: {world_size: 2, rendezvous: '127.0.0.1:2'}\n")
    monkeypatch.delenv("DELTASERVE_DP_RANK", raising=False)
    with pytest.raises(JobConfigError, match="set DELTASERVE_DP_RANK to 0..1"):
        configure_data_parallel(_vllm_config(separate, 1))
    monkeypatch.setenv("DELTASERVE_DP_RANK", "1")
    configure_data_parallel(_vllm_config(separate, 1))
    with pytest.raises(JobConfigError, match=r"data_parallel\.rendezvous: required"):
        configure_data_parallel(_vllm_config(job, 4, local=2))  # this server starts only some of the engines
    with pytest.raises(ValueError, match="dense models only"):
        configure_data_parallel(_vllm_config(job, 2, moe=True))
    with open(job, "a") as f:
        f.write("data_parallel: {world_size: 3, rendezvous: '127.0.0.1:2'}\n")
    with pytest.raises(JobConfigError, match=r"data_parallel\.world_size is 3"):
        configure_data_parallel(_vllm_config(job, 2))


def _rank_job(rank: int | None, status: str, tokens: int, samples: int, step: int) -> dict[str, Any]:
    ds: dict[str, Any] = {"step": step, "loss": 1.0, "optimizer_steps_this_run": step, "backward_busy": False,
                          "progress": {"epoch": 0, "epochs": 1, "samples_completed": samples, "samples_total": 10,
                                       "fraction": samples / 10},
                          "slo_attainment": {"slo": 1.0, "requests": rank or 0}}
    if rank is not None:
        ds["data_parallel"] = {"rank": rank, "world_size": 2, "last_global_step": {"seq": step},
                               "global_steps_with_own_samples": step, "stale_parts": 0}
    return {"object": "fine_tuning.job", "id": "ftjob-x", "status": status, "trained_tokens": tokens,
            "deltaserve": ds}


def test_the_ranks_answers_merge_into_one_job_with_per_rank_and_total_progress() -> None:
    ranks = [{"result": _rank_job(1, "running", 70, 3, 5)}, {"result": _rank_job(0, "succeeded", 100, 6, 5)}]
    job = merge_rank_answers("get", ranks)["result"]
    assert job["status"] == "running" and job["trained_tokens"] == 170
    assert job["deltaserve"]["progress"]["samples_completed"] == 9 and job["deltaserve"]["progress"]["fraction"] == 0.9
    dp = job["deltaserve"]["data_parallel"]
    assert [r["rank"] for r in dp["ranks"]] == [0, 1] and [r["trained_tokens"] for r in dp["ranks"]] == [100, 70]
    assert [r["slo_requests"] for r in dp["ranks"]] == [0, 1]
    assert dp["total"] == {"trained_tokens": 170, "samples_completed": 9, "step": 5, "steps_agree": True}
    assert ranks[1]["result"]["trained_tokens"] == 100  # the ranks' own answers are left as they were
    listed = merge_rank_answers("list", [{"result": [r["result"]]} for r in ranks])["result"]
    assert listed == [job]
    refused = {"status": 409, "error": {"message": "ended"}}
    assert merge_rank_answers("pause", [{"result": {"ok": 1}}, refused]) == refused
    assert merge_rank_answers("get", ranks[:1]) == ranks[0]  # one engine: its answer as it is
    with pytest.raises(ValueError, match="without a data-parallel rank"):  # N engines training N copies
        merge_rank_answers("get", [{"result": _rank_job(None, "running", 1, 1, 1)}] * 2)


# ---------------------------------------------------------------------------------------------- vllm serve


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_job(tmp_path_factory.mktemp("dp-serve"), adapter=ADAPTER, epochs=EPOCHS,
                     checkpoint="{dir: ckpt, every_steps: 2, keep: 50}", publish="{policy: on_checkpoint}")
    with open(path, "a") as f:  # no world_size, no rendezvous: vLLM's --data-parallel-size gives them
        f.write("data_parallel: {claim_samples: 4}\n")
    return path


@pytest.fixture(scope="module")
def server(job: Path, tiny_model: Path, calibrated: list[str]) -> Iterator[dict]:  # noqa: F811
    env = dict(_env(job.parent), VLLM_PLUGINS="deltaserve,deltaserve_jobs")
    env.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING", None)  # vLLM refuses it with several API servers
    info = _start(job, tiny_model, calibrated, env, "server.log", "--data-parallel-size", "2", "--api-key", API_KEY)
    yield info
    proc = info["proc"]
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _get_job(server: dict) -> dict:
    status, body = http_json("GET", f"{server['base']}/v1/fine_tuning/jobs/{JOB_ID}", key=API_KEY)
    assert status == 200, body
    return body


def test_greedy_outputs_equal_plain_vllm_on_every_engine(
        plain_outputs: list[list[int]], server: dict) -> None:  # noqa: F811
    """Plain vLLM's outputs are taken first, so the requests come while the job trains. Concurrent requests, so
    that the load balancer spreads them over both engines (each API server prefers its own engine when both are
    idle). Each rank's SLO monitor, which samples its engine's running requests every 0.1 s, shows that both
    engines served; long requests make sure it sees them."""
    def ask(prompt: list[int]) -> list[int]:
        status, body = _complete(server["base"], server["model"], prompt)
        assert status == 200, body
        return body["choices"][0]["token_ids"]

    def ask_long(prompt: list[int]) -> int:
        status, body = http_json("POST", f"{server['base']}/v1/completions", {
            "model": server["model"], "prompt": prompt, "max_tokens": 48, "temperature": 0.0, "ignore_eos": True},
            key=API_KEY)
        assert status == 200, body
        return body["usage"]["completion_tokens"]

    assert _get_job(server)["status"] == "running", "the job ended before the requests came: raise EPOCHS"
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        for _ in range(3):
            assert list(pool.map(ask, PROMPTS)) == plain_outputs
        assert list(pool.map(ask_long, PROMPTS)) == [48] * len(PROMPTS)
    requests = [r["slo_requests"] for r in _get_job(server)["deltaserve"]["data_parallel"]["ranks"]]
    assert min(requests) > 0, requests


def test_both_ranks_train_one_job_and_the_jobs_api_shows_each_and_the_total(server: dict) -> None:
    deadline = time.monotonic() + 300
    while (job := _get_job(server))["status"] != "succeeded":
        assert server["proc"].poll() is None, server["log"].read_text()[-4000:]
        assert time.monotonic() < deadline, json.dumps(job)[:3000]
        time.sleep(1)
    dp = job["deltaserve"]["data_parallel"]
    ranks = dp["ranks"]
    assert dp["world_size"] == 2 and [r["rank"] for r in ranks] == [0, 1], dp
    for r in ranks:
        assert r["status"] == "succeeded" and r["trained_tokens"] > 0 and r["samples_completed"] > 0, r
        assert r["global_steps_with_own_samples"] > 0 and r["step"] == dp["total"]["step"], r
    # each sample counted once per epoch over the ranks: one trained on both would push the sum past the epochs
    assert dp["total"]["samples_completed"] == job["deltaserve"]["progress"]["samples_completed"] == EPOCHS * SAMPLES
    assert dp["total"]["trained_tokens"] == job["trained_tokens"] == sum(r["trained_tokens"] for r in ranks)
    assert dp["total"]["steps_agree"] and dp["total"]["step"] >= 2
    log = server["log"].read_text()
    assert log.count("one fine-tuning job over the 2 data-parallel engines") == 1, log[-4000:]
    assert "data-parallel rank 0" in log and "data-parallel rank 1" in log


def test_metrics_show_every_rank_on_vllms_own_endpoint(server: dict) -> None:
    """One API server per engine here (vLLM's default with --data-parallel-size), so prometheus_client's
    multiprocess folder: each rank's series carry its dp_rank, none overwrites the other's, and both ranks applied
    the same optimizer steps. Runs after the job ended (the previous test); each rank's exporter samples its job
    every second, so the final values may reach the page up to an interval after the jobs API says "succeeded"."""
    from deltaserve_core.metrics import JOB_LABEL, RANK_LABEL
    from deltaserve_core.testing.metrics import assert_sane

    ranks = [tuple(sorted({JOB_LABEL: ADAPTER, RANK_LABEL: str(r)}.items())) for r in (0, 1)]
    deadline = time.monotonic() + 30
    while True:
        series = _scrape(server["base"])
        steps = [series["deltaserve_adapter_step"][k] for k in ranks]
        if steps[0] == steps[1] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for rank in (0, 1):
        assert_sane(series, ADAPTER, multiprocess=True, published=False, rank=rank)
    assert steps[0] == steps[1] >= 2, steps
    assert all(dict(k).get(RANK_LABEL) in ("0", "1") for k in series["deltaserve_optimizer_steps_total"])


def test_a_published_version_is_served_by_name_from_every_engine(server: dict) -> None:
    """The API servers load a requested version into every engine (vLLM's add_lora reaches them all): the same
    greedy tokens whichever engine runs it, and different from the base model's."""
    versions = sorted(server["ckpt"].joinpath("published").glob(f"{ADAPTER}@v*"),
                      key=lambda p: int(p.name.split("@v")[1]))
    assert versions, server["log"].read_text()[-4000:]
    name = versions[-1].name

    def ask(model: str) -> tuple[str, list[int]]:
        status, body = http_json("POST", f"{server['base']}/v1/completions", {
            "model": model, "prompt": PROMPTS[1], "max_tokens": 48, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True}, key=API_KEY)
        assert status == 200, body
        return body["model"], body["choices"][0]["token_ids"]

    before = {r["rank"]: r["slo_requests"] for r in _get_job(server)["deltaserve"]["data_parallel"]["ranks"]}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, [name] * 8))
    assert {model for model, _ in answers} == {name} and len({tuple(t) for _, t in answers}) == 1, answers
    assert answers[0][1] != ask(server["model"])[1]  # the trained adapter changes the greedy tokens
    after = {r["rank"]: r["slo_requests"] for r in _get_job(server)["deltaserve"]["data_parallel"]["ranks"]}
    assert all(after[r] > before[r] for r in before), (before, after)


def _tensors(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_samples_once_and_identical_adapters_after_the_interrupt(server: dict) -> None:
    """A Ctrl-C writes each rank's final checkpoint; each records the samples its rank trained in the last epoch."""
    proc = server["proc"]
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=180)
    ckpt = server["ckpt"]
    newest = {}
    for rank in (0, 1):
        folders = sorted((p for p in (ckpt / f"rank-{rank}").glob("checkpoint-*")
                          if (p / "trainer_state.json").is_file()), key=lambda p: int(p.name.split("-")[1]))
        assert folders, server["log"].read_text()[-4000:]
        newest[rank] = folders[-1]
    done = {rank: set(json.loads((folder / "trainer_state.json").read_text())["extra"]["pool"]["done_in_epoch"])
            for rank, folder in newest.items()}
    assert done[0] and done[1] and not done[0] & done[1], done
    assert len(done[0] | done[1]) == SAMPLES
    steps = {rank: {p.name for p in (ckpt / f"rank-{rank}").glob("checkpoint-*")} for rank in (0, 1)}
    common = sorted(steps[0] & steps[1], key=lambda n: int(n.split("-")[1]))
    assert len(common) >= 2, steps
    published = ckpt / "published"
    for name in common:
        weights = _tensors(ckpt / "rank-0" / name)
        assert _same(weights, _tensors(ckpt / "rank-1" / name)), name
        version = published / f"{ADAPTER}@v{int(name.split('-')[1])}"
        if version.is_dir():  # on_checkpoint: one folder for both ranks, written by the first
            assert _same(weights, _tensors(version)), version.name
    assert any((published / f"{ADAPTER}@v{int(n.split('-')[1])}").is_dir() for n in common), list(published.iterdir())
    assert not list(published.glob("*.tmp-*")), list(published.iterdir())
