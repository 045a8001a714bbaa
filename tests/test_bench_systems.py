"""Every benchmarked system runs on the reference host with a tiny model, on the same replayed arrivals, and the
policies leave their fingerprints in where fine-tuning rows went. Plus a CLI smoke test."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from deltaserve_core.bench import CHILD_ENGINES, SYSTEMS, family
from deltaserve_core.bench.lengths import LengthTable
from deltaserve_core.bench.config import BenchConfig
from deltaserve_core.bench.runner import run_bench
from deltaserve_core.latency_model import (
    DecodeCoefficients,
    LatencyModel,
    PrefillCoefficients,
)
from deltaserve_core.types import ExecutionMode

_TOPICS = ["the sea", "a mountain", "bread", "rain", "the moon", "a river", "music", "trees", "winter", "a city"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    records = [{"instruction": f"Write one sentence about {t}.", "input": "",
                "output": f"Here is a short sentence about {t}, written plainly."} for t in _TOPICS * 4]
    path = tmp_path_factory.mktemp("bench-data") / "train.json"
    path.write_text(json.dumps(records))
    return path


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bench-trace") / "trace.csv"
    rows = ["timestamp,prompt_tokens,output_tokens"]
    rows += [f"{1000 + 0.3 * i:.2f},{12 + 3 * i},{3 + i % 3}" for i in range(7)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _model() -> LatencyModel:
    # Generous fixed coefficients: the test is about each system's mechanics, not pricing.
    m = LatencyModel()
    m.set_coefficients(ExecutionMode.EAGER, prefill=PrefillCoefficients(1e-9, 2e-5, 2e-5, 1e-9, 2e-3),
                       decode=DecodeCoefficients(1e-4, 1e-9, 2e-3))
    return m


@pytest.fixture(scope="module")
def bench_result(tiny_model: Path, dataset: Path, trace_file: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> dict:
    # One run shared by the tests below: each system spawns its own backward (or trainer) process, which is most
    # of the time; the tests only read different parts of the same result.
    # scale 1: the file's own pace (auto would compress its 7 arrivals to the fixed model's large capacity)
    cfg = BenchConfig(host="reference", model=str(tiny_model), trace=str(trace_file), duration_s=None, scale=1.0,
                      ttft_s=5.0, tpot_s=2.0, dataset=str(dataset), ft_max_length=64, buffer_tokens=512,
                      backward_batch_tokens=96, dedicated_s=1.5, out_dir=str(tmp_path_factory.mktemp("bench-out")),
                      stem="t", progress=False)
    return run_bench(cfg, latency_model=_model(), lengths=LengthTable(((8, 2),), "unused"))


@pytest.mark.slow
def test_every_system_serves_the_same_arrivals(bench_result: dict) -> None:
    s = bench_result["systems"]
    assert list(s) == bench_result["instances"]
    # stock and served: the vLLM host only (test_bench_stock, test_bench_served)
    assert {family(n) for n in s} == set(SYSTEMS) - set(CHILD_ENGINES)
    for name, row in s.items():
        assert row["requests"] == 7, name
        assert row["inference_tokens_per_s"] > 0, name


@pytest.mark.slow
def test_each_policy_leaves_its_fingerprint(bench_result: dict) -> None:
    s = bench_result["systems"]
    assert s["bare"]["finetune_tokens"] == 0 and s["bare"]["ft_forward_tokens_alone"] == 0
    assert s["deltaserve"]["finetune_forward_tokens"] > 0
    io = s["idle_only"]
    assert io["ft_forward_tokens_with_prefill"] == 0 and io["ft_forward_tokens_with_decode_only"] == 0
    assert io["ft_forward_tokens_alone"] > 0
    ls = s["llmstation"]
    assert ls["ft_forward_tokens_alone"] == 0 and ls["ft_forward_tokens_with_prefill"] == 0
    assert s["no_interrupt"]["aborted_samples"] == 0
    for name in (n for n in s if family(n) in ("static_mps", "split_pool")):
        assert s[name]["optimizer_steps"] > 0 and s[name]["finetune_tokens"] > 0, name
    assert s["static_mps"]["finetune_cores"] is None and s["static_mps"]["engine_capped"] is False
    split = next(n for n in s if family(n) == "split_pool")
    assert s[split]["engine_capped"] is True or s[split]["shared_cores"]
    # every refusal to admit is counted by reason, and the counts cover every step the co-server decided
    reasons = s["deltaserve"]["admission_reasons"]
    assert reasons and all(v > 0 for v in reasons.values())
    assert "host_work_forced" in s["deltaserve"] and "host_work_max_wait_s" in s["deltaserve"]


@pytest.mark.slow
def test_harvest_inputs_and_files(bench_result: dict) -> None:
    result = bench_result
    assert result["trainer_alone"]["finetune_tokens_per_s"] > 0  # the harvest denominator
    assert result["deltaserve_idle_rate"]["backward_threads"] >= 1  # the diagnostic beside it
    assert result["systems"]["deltaserve"]["deltaserve_idle_rate"] > 0
    assert 0 < result["bare_idle_fraction"] <= 1
    ds = result["systems"]["deltaserve"]
    assert ds["harvest"] == pytest.approx(ds["finetune_tokens_per_s"] / (
        result["trainer_alone"]["finetune_tokens_per_s"] * result["bare_idle_fraction"]))
    assert "ratio" in result["headline"]["auto"]
    for key in ("json", "summary_csv", "requests_csv", "steps_csv", "png"):
        assert Path(result["files"][key]).is_file(), key
    assert not list(Path(result["files"]["json"]).parent.glob("*.partial.json")), "the full result replaces it"
    saved = json.loads(Path(result["files"]["json"]).read_text())
    assert saved["trace"]["requests"] == 7 and list(saved["timelines"]) == result["instances"]
    with open(result["files"]["steps_csv"], newline="") as fh:
        rows = list(csv.DictReader(fh))
    ds_reasons = {r["ft_reason"] for r in rows if r["system"] == "deltaserve"}
    assert ds_reasons - {""}, "the co-served steps carry admission's reason"
    assert {r["ft_reason"] for r in rows if r["system"] == "bare"} == {""}


def test_auto_slo_is_tight_relative_to_the_worst_step() -> None:
    from deltaserve_core.bench.config import auto_slo

    m = _model()
    ttft, tpot, why = auto_slo(m, max_prompt=64, max_output=8, max_batch_tokens=256, max_running=4)
    worst = m.predict([64] * 4, 4, 4 * (64 + 4), (), ExecutionMode.EAGER)
    assert tpot == pytest.approx(1.5 * worst) and ttft == pytest.approx(tpot * 10 / 3)
    assert "1.5 x" in why


def test_cli_bench_smoke(tiny_model: Path, trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    from deltaserve_core.cli import main

    # the CLI quietens vLLM for its own process; in-process here, so undo it for the tests that follow
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")

    lengths = tmp_path / "lengths.csv"
    lengths.write_text("prompt_tokens,output_tokens\n10,3\n")
    rc = main(["bench", "--host", "reference", "--model", str(tiny_model), "--trace", str(trace_file),
               "--systems", "bare", "--duration", "0", "--lengths", str(lengths), "--ttft", "5", "--tpot", "2",
               "--dedicated", "0", "--out", str(tmp_path), "--name", "cli", "--no-progress", "--no-plot"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "bare" in out and (tmp_path / "cli.json").is_file() and (tmp_path / "cli_summary.csv").is_file()
    assert main(["bench", "--systems", "nonsense", "--no-progress"]) == 2


def test_default_output_is_not_the_committed_results_and_is_never_overwritten(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import argparse

    from deltaserve_core import registry
    from deltaserve_core.bench.cli import add_bench_arguments, config_from_args
    from deltaserve_core.bench.config import DEFAULT_OUT_DIR
    from deltaserve_core.cli import main

    p = argparse.ArgumentParser()
    add_bench_arguments(p)
    cfg = config_from_args(p.parse_args([]))
    assert cfg.out_dir == DEFAULT_OUT_DIR and not cfg.overwrite
    assert not Path(DEFAULT_OUT_DIR).is_absolute() and not DEFAULT_OUT_DIR.startswith("benchmarks")
    assert config_from_args(p.parse_args(["--force"])).overwrite
    assert config_from_args(p.parse_args(["--out", "mine"])).overwrite  # a folder chosen on purpose

    def no_host(*a: object, **k: object) -> None:
        raise AssertionError("create_host was called")

    monkeypatch.setattr(registry, "create_host", no_host)
    monkeypatch.chdir(tmp_path)
    earlier = tmp_path / DEFAULT_OUT_DIR / "run_summary.csv"
    earlier.parent.mkdir()
    earlier.write_text("an earlier run's results\n")
    argv = ["bench", "--host", "reference", "--model", str(tiny_model), "--systems", "bare", "--name", "run",
            "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(Path(DEFAULT_OUT_DIR) / "run_summary.csv") in err and "--force" in err, err
    assert earlier.read_text() == "an earlier run's results\n"
    with pytest.raises(AssertionError, match="create_host was called"):  # past the check, at the host
        main([*argv, "--force"])


def test_cpu_backward_threads_leave_the_host_its_threads() -> None:
    import os

    import torch

    from deltaserve_core.bench.runner import cpu_backward_threads

    cores = len(os.sched_getaffinity(0))
    assert cpu_backward_threads() == max(1, cores - torch.get_num_threads())


def test_a_cut_short_bench_keeps_each_finished_system(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """What a bench killed by a time limit leaves: every system that finished, summarised, in valid JSON."""
    from deltaserve_core.bench.metrics import RequestResult, SystemRun
    from deltaserve_core.bench.runner import _write_partial

    cfg = BenchConfig(host="reference", out_dir=str(tmp_path / "out"), stem="cut")
    reqs = [RequestResult("a", 0.0, 8, 3, (0.05, 0.07, 0.09)), RequestResult("b", 0.5, 8, 2, (0.6, 0.9))]
    _write_partial(cfg, "cut", "bare", SystemRun("bare", 2.0, reqs, extra={"saturation": {
        "output_tokens_per_s": 1234.0}}), (0.4, 0.12, {}))
    _write_partial(cfg, "cut", "stock", SystemRun("stock", 2.0, reqs[:1]), None)  # before any SLO was known
    saved = json.loads((tmp_path / "out" / "cut.partial.json").read_text())
    assert list(saved["systems"]) == ["bare", "stock"]
    assert saved["systems"]["bare"]["saturation"]["output_tokens_per_s"] == 1234.0
    assert saved["systems"]["bare"]["p99_ttft_s"] == pytest.approx(0.0995)
    assert saved["systems"]["stock"]["requests"] == 1 and saved["slo"] is None
    assert saved["environment"]["commit"]
    err = capsys.readouterr().err
    assert "bare: saturation 1234 tok/s" in err and "stock: saturation None tok/s" in err
