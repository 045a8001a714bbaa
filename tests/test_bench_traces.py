"""Trace generators (shape statistics, seeding, scaling), ShareGPT reading, and trace-file replay round trips."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from deltaserve_core.bench.lengths import (
    LengthTable,
    iter_sharegpt_records,
    load_length_table,
    sharegpt_pairs,
)
from deltaserve_core.bench.traces import (
    BURST_DENSE,
    BURST_LIGHT,
    capacity_scale,
    generate_trace,
    load_trace,
    rate_curve,
)

LENGTHS = LengthTable(tuple((10 + 7 * i, 3 + (i % 11)) for i in range(50)), "test")


def _in_peak(t: float, shape) -> bool:
    return t >= shape.first_peak_s and (t - shape.first_peak_s) % shape.period_s < shape.peak_s


@pytest.mark.parametrize("name,shape", [("burst-light", BURST_LIGHT), ("burst-dense", BURST_DENSE)])
def test_burst_rates_match_their_shape(name: str, shape) -> None:
    tr = generate_trace(name, LENGTHS, seed=3, scale=1.0)
    assert tr.duration_s == pytest.approx(shape.duration_s)
    peak_time = sum(shape.peak_s for k in range(10) if shape.first_peak_s + k * shape.period_s < shape.duration_s)
    peak = sum(1 for r in tr.requests if _in_peak(r.t, shape)) / peak_time
    base = sum(1 for r in tr.requests if not _in_peak(r.t, shape)) / (shape.duration_s - peak_time)
    # Poisson counts: ~500-1400 arrivals in peaks, a 10 % band is > 3 sigma
    assert peak == pytest.approx(shape.peak_rps, rel=0.1)
    assert base == pytest.approx(shape.base_rps, rel=0.2)


def test_dense_spends_more_time_under_high_load_than_light() -> None:
    light, _ = rate_curve("burst-light")
    dense, _ = rate_curve("burst-dense")
    assert (dense >= 100).mean() > (light >= 70).mean() * 1.5


def test_seeding_and_scaling() -> None:
    a = generate_trace("burst-light", LENGTHS, seed=1, scale=0.1)
    b = generate_trace("burst-light", LENGTHS, seed=1, scale=0.1)
    c = generate_trace("burst-light", LENGTHS, seed=2, scale=0.1)
    assert a.requests == b.requests
    assert a.requests != c.requests
    big = generate_trace("burst-light", LENGTHS, seed=1, scale=0.5)
    assert 3.5 < len(big) / len(a) < 6.5
    fast = generate_trace("burst-light", LENGTHS, seed=1, scale=0.5, time_scale=0.25)
    assert fast.duration_s == pytest.approx(15.0)
    assert len(fast) == len(big)  # compressing time keeps every arrival, only closer together
    cut = generate_trace("burst-light", LENGTHS, seed=1, scale=0.5, duration_s=12.0)
    assert cut.duration_s == 12.0 and all(r.t < 12.0 for r in cut.requests)
    assert cut.requests == tuple(r for r in big.requests if r.t < 12.0)
    assert capacity_scale(30.0, load=0.8) == pytest.approx(0.2)


def test_lengths_are_clipped_and_drawn_from_the_table() -> None:
    tr = generate_trace("burst-dense", LENGTHS, seed=0, scale=0.2, max_prompt=100, max_output=8)
    pairs = set(LENGTHS.pairs)
    for r in tr.requests:
        assert r.prompt_tokens <= 100 and r.output_tokens <= 8
        assert any(min(p, 100) == r.prompt_tokens and min(o, 8) == r.output_tokens for p, o in pairs)


def test_production_trace_is_irregular_with_spikes_and_quiet_stretches() -> None:
    for seed in (0, 1, 2):
        tr = generate_trace("production", LENGTHS, seed=seed)
        s = tr.summary()
        assert s["duration_s"] == pytest.approx(1200.0)
        assert s["peak_rps_1s"] > 90  # a >=105 req/s spike, counted in 1 s bins
        rates = tr.rate(10.0)
        assert sum(r < 1.0 for r in rates) >= 3  # near-zero stretches of 10 s and more
        assert s["mean_rps"] < 0.5 * s["peak_rps_1s"]
    assert generate_trace("production", LENGTHS, seed=4).requests == generate_trace("production", LENGTHS,
                                                                                     seed=4).requests


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_trace_file_round_trip(tmp_path: Path, suffix: str) -> None:
    tr = generate_trace("burst-light", LENGTHS, seed=5, scale=0.05)
    path = tr.save(tmp_path / f"t{suffix}")
    back = load_trace(path)
    assert len(back) == len(tr)
    for a, b in zip(tr.requests, back.requests):
        assert b.t == pytest.approx(a.t - tr.requests[0].t, abs=1e-5)
        assert (a.prompt_tokens, a.output_tokens) == (b.prompt_tokens, b.output_tokens)
    fast = load_trace(path, scale=2.0)
    assert fast.requests[-1].t == pytest.approx(back.requests[-1].t / 2, abs=1e-5)


def test_replay_of_absolute_timestamps_without_lengths(tmp_path: Path) -> None:
    path = tmp_path / "prod.csv"
    path.write_text("timestamp\n1700000010.5\n1700000010.0\n1700000012.25\n")
    with pytest.raises(ValueError, match="length source"):
        load_trace(path)
    tr = load_trace(path, LENGTHS, seed=1)
    assert [r.t for r in tr.requests] == pytest.approx([0.0, 0.5, 2.25])
    assert all((r.prompt_tokens, r.output_tokens) in LENGTHS.pairs for r in tr.requests)


def test_truncated_sharegpt_file_is_read_record_by_record(tmp_path: Path) -> None:
    recs = [{"id": str(i), "conversations": [{"from": "human", "value": f"question {i} " * (i + 1)},
                                             {"from": "gpt", "value": f"answer {i}"}]} for i in range(5)]
    text = json.dumps(recs, indent=1)
    cut = text[: text.rindex('"answer 4"') + 5]  # the packager's file ends mid-record, like this
    path = tmp_path / "sg.json"
    path.write_text(cut)
    got = list(iter_sharegpt_records(path))
    assert [r["id"] for r in got] == ["0", "1", "2", "3"]
    pairs = list(sharegpt_pairs(iter(got)))
    assert pairs[2] == ("question 2 " * 3, "answer 2")


def test_length_table_from_csv(tmp_path: Path) -> None:
    p = tmp_path / "l.csv"
    p.write_text("prompt_tokens,output_tokens\n5,6\n7,8\n")
    t = load_length_table(p)
    assert t.pairs == ((5, 6), (7, 8))
    assert t.sample(random.Random(0), max_prompt=6) in ((5, 6), (6, 8))
    bad = tmp_path / "b.csv"
    bad.write_text("prompt,output\n1,2\n")
    with pytest.raises(ValueError, match="prompt_tokens"):
        load_length_table(bad)


def test_cli_passes_the_trainer_settings_to_every_fine_tuning_system() -> None:
    import argparse

    from deltaserve_core.bench.cli import add_bench_arguments, config_from_args
    from deltaserve_core.bench.config import _job

    p = argparse.ArgumentParser()
    add_bench_arguments(p)
    cfg = config_from_args(p.parse_args(["--backward-batch-tokens", "512", "--pack-tokens", "0",
                                         "--buffer-tokens", "4096", "--systems", "deltaserve,split_pool",
                                         "--dataset", "train.json"]))
    assert (cfg.backward_batch_tokens, cfg.pack_tokens, cfg.buffer_tokens) == (512, 0, 4096)
    job = _job(cfg, 1.0, 0.2, "/tmp/unused-ckpt")  # the job every co-served system and the split pool train with
    assert (job.backward_batch_tokens, job.pack_tokens, job.buffer_tokens) == (512, 0, 4096)
