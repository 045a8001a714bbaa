"""Trace files as users have them (Mooncake JSONL, Azure-style CSV with date-times, unknown column names), their
validation before any host starts, and the window / scale arithmetic of a file replay."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from deltaserve_core.bench.traces import (
    auto_file_factor,
    load_trace,
    parse_trace_columns,
    read_trace_file,
    window_trace,
)

MOONCAKE = Path("/work/shared/traces/mooncake/conversation_trace.jsonl")


def _mooncake(tmp_path: Path, rows: list[tuple[int, int, int]]) -> Path:
    p = tmp_path / "mc.jsonl"
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": [0, 1]})
                         + "\n" for t, i, o in rows))
    return p


def test_mooncake_rows_are_milliseconds_with_their_own_lengths(tmp_path: Path) -> None:
    p = _mooncake(tmp_path, [(0, 6758, 500), (0, 7322, 490), (1500, 300, 20), (4000, 12, 7)])
    tf = read_trace_file(p)
    assert tf.times_s == pytest.approx((0.0, 0.0, 1.5, 4.0))
    assert tf.prompts == (6758, 7322, 300, 12) and tf.outputs == (500, 490, 20, 7)
    assert "Mooncake" in tf.report["time_unit"]
    assert tf.report["columns"] == {"time": "timestamp", "prompt": "input_length", "output": "output_length"}
    tr = window_trace(tf, factor=1.0, max_prompt=1024, max_output=256)
    assert [(r.prompt_tokens, r.output_tokens) for r in tr.requests] == [(1024, 256), (1024, 256), (300, 20), (12, 7)]
    assert tr.params["prompts_clipped"] == 2 and tr.params["outputs_clipped"] == 2


@pytest.mark.skipif(not MOONCAKE.is_file(), reason="the shared Mooncake trace is not on this machine")
def test_the_shared_mooncake_trace_reads_whole() -> None:
    tf = read_trace_file(MOONCAKE)
    assert len(tf) == 12031 and tf.report["bad_rows"] == 0
    assert 3500 < tf.times_s[-1] < 3600  # ms in the file: 3,537 s, not 3.5 million


def test_azure_csv_with_datetimes_unsorted(tmp_path: Path) -> None:
    p = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:46.1805900,4808,10\n"
                 "2023-11-16 18:15:50.1805900,3180,8\n")
    tf = read_trace_file(p)
    assert tf.times_s == pytest.approx((0.0, 0.5, 4.0), abs=1e-6)
    assert tf.prompts == (4808, 374, 3180) and tf.outputs == (10, 44, 8)
    assert tf.report["time_unit"] == "ISO date-times" and tf.report["sorted_in_file"] is False


def test_numeric_units_by_name_magnitude_and_flag(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text("arrival_time,prompt_tokens,output_tokens\n1700000000000,5,6\n1700000000250,5,6\n")
    tf = read_trace_file(p)
    assert tf.times_s[-1] == pytest.approx(0.25) and "epoch" in tf.report["time_unit"]
    q = tmp_path / "b.csv"
    q.write_text("t,num_prefill_tokens,num_decode_tokens\n0,5,6\n2,5,6\n")
    assert read_trace_file(q).times_s[-1] == pytest.approx(2.0)  # relative numbers: seconds
    assert read_trace_file(q, time_unit="ms").times_s[-1] == pytest.approx(0.002)
    r = tmp_path / "c.jsonl"
    r.write_text('{"time_us": 0, "input_tokens": 3, "output_tokens": 4}\n{"time_us": 5000, "input_tokens": 3, '
                 '"output_tokens": 4}\n')
    assert read_trace_file(r).times_s[-1] == pytest.approx(0.005)


def test_unknown_columns_need_a_mapping(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("when_ms,in,out\n100,10,2\n300,20,3\n")
    with pytest.raises(ValueError, match="no time column"):
        read_trace_file(p)
    cols = parse_trace_columns("time=when_ms,prompt=in,output=out")
    tf = read_trace_file(p, columns=cols)
    assert tf.times_s == pytest.approx((0.0, 0.2))  # the _ms suffix decides the unit
    assert tf.prompts == (10, 20)
    with pytest.raises(ValueError, match="no column 'nope'"):
        read_trace_file(p, columns={"time": "nope"})
    with pytest.raises(ValueError, match="expected"):
        parse_trace_columns("when=when_ms")


def test_bad_rows_are_counted_with_their_line_numbers(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
                 '{"timestamp": 10, "input_length": 5, "output_length": 2}\n'
                 '{"timestamp": 20, "input_length": 5\n'              # 3: broken JSON
                 '{"timestamp": 30, "input_length": 5, "output_length": 2}\n'
                 '{"timestamp": 40, "input_length": 0, "output_length": 2}\n'   # 5: zero length
                 '{"input_length": 5, "output_length": 2}\n'          # 6: no timestamp
                 '{"timestamp": 60, "input_length": 2.5, "output_length": 2}\n')  # 7: not an integer
    with pytest.raises(ValueError, match=r"4 bad row\(s\).*line 3") as exc:
        read_trace_file(p)
    assert "line 5" in str(exc.value) and "line 6" in str(exc.value)
    tf = read_trace_file(p, skip_bad=True)
    assert tf.report["bad_rows"] == 4 and tf.report["bad_lines"] == [3, 5, 6, 7]
    assert len(tf) == 3 and tf.report["usable_rows"] == 3
    csvp = tmp_path / "bad.csv"
    csvp.write_text("timestamp,prompt_tokens,output_tokens\n0,5,2\nsoon,5,2\n1,-3,2\n")
    with pytest.raises(ValueError, match="line 3.*line 4"):
        read_trace_file(csvp)


def test_files_that_cannot_be_used(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_trace_file(tmp_path / "missing.jsonl")
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="no rows"):
        read_trace_file(empty)
    half = tmp_path / "h.csv"
    half.write_text("timestamp,prompt_tokens\n0,5\n")
    with pytest.raises(ValueError, match="not the other"):
        read_trace_file(half)


def _uniform(tmp_path: Path, n: int = 100) -> Path:
    p = tmp_path / "u.csv"
    p.write_text("timestamp,prompt_tokens,output_tokens\n" + "".join(f"{i},{10 + i},{1 + i % 5}\n" for i in range(n)))
    return p


def test_auto_scale_maps_the_window_mean_to_the_target(tmp_path: Path) -> None:
    tf = read_trace_file(_uniform(tmp_path))  # one arrival per second for 100 s
    f = auto_file_factor(tf, start_s=50.0, duration_s=10.0, target_rps=4.0)
    assert f == pytest.approx(0.25)  # 40 arrivals (file 50..89 s) replayed in 10 s
    tr = window_trace(tf, factor=f, start_s=50.0, duration_s=10.0)
    assert len(tr) == 40 and tr.duration_s == 10.0
    assert tr.requests[0].t == 0.0 and tr.requests[0].prompt_tokens == 60  # the row at file second 50
    assert tr.params["file_window_s"] == pytest.approx(40.0)
    slow = auto_file_factor(tf, start_s=0.0, duration_s=10.0, target_rps=0.5)
    assert len(window_trace(tf, factor=slow, duration_s=10.0)) == 5
    with pytest.raises(ValueError, match="fewer than 2"):
        auto_file_factor(tf, start_s=99.5, duration_s=10.0, target_rps=1.0)


def test_scale_and_time_scale_divide_the_gaps(tmp_path: Path) -> None:
    p = _uniform(tmp_path, 10)
    assert load_trace(p, scale=2.0).requests[-1].t == pytest.approx(4.5)
    assert load_trace(p, time_scale=0.1).requests[-1].t == pytest.approx(0.9)
    win = load_trace(p, start_s=3.0, duration_s=2.5)
    assert [r.t for r in win.requests] == pytest.approx([0.0, 1.0, 2.0])


def test_run_bench_refuses_a_bad_file_before_the_host_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deltaserve_core.registry as registry
    from deltaserve_core.bench.cli import add_bench_arguments, config_from_args
    from deltaserve_core.bench.config import BenchConfig
    from deltaserve_core.bench.runner import run_bench

    def no_host(*a: object, **k: object) -> None:
        raise AssertionError("create_host was called before the trace file was validated")

    monkeypatch.setattr(registry, "create_host", no_host)
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,prompt_tokens,output_tokens\n0,5,2\n1,five,2\n")
    cfg = BenchConfig(host="reference", trace=str(bad), systems=("bare",), out_dir=str(tmp_path), progress=False)
    with pytest.raises(ValueError, match="line 3"):
        run_bench(cfg)
    with pytest.raises(FileNotFoundError):
        run_bench(BenchConfig(host="reference", trace=str(tmp_path / "none.csv"), systems=("bare",),
                              out_dir=str(tmp_path), progress=False))
    late = _uniform(tmp_path, 5)
    with pytest.raises(ValueError, match="past the file's last arrival"):
        run_bench(BenchConfig(host="reference", trace=str(late), systems=("bare",), trace_start_s=10.0,
                              out_dir=str(tmp_path), progress=False))
    p = argparse.ArgumentParser()
    add_bench_arguments(p)
    with pytest.raises(ValueError, match="line 3"):
        config_from_args(p.parse_args(["--trace", str(bad), "--systems", "bare"]))
    # the good file passes validation and reaches the host (which this test refuses to start)
    with pytest.raises(AssertionError, match="create_host was called"):
        run_bench(BenchConfig(host="reference", trace=str(late), systems=("bare",), out_dir=str(tmp_path),
                              progress=False))


def test_cli_flags_reach_the_config(tmp_path: Path) -> None:
    from deltaserve_core.bench.cli import add_bench_arguments, config_from_args

    p = tmp_path / "x.csv"
    p.write_text("when,in,out\n0,10,2\n1,20,3\n")
    ap = argparse.ArgumentParser()
    add_bench_arguments(ap)
    cfg = config_from_args(ap.parse_args([
        "--trace", str(p), "--trace-columns", "time=when,prompt=in,output=out", "--trace-time-unit", "ms",
        "--trace-start", "0.5", "--slo-regime", "paper,tight", "--static-shares", "25,75", "--device", "cuda",
        "--systems", "bare,deltaserve,static_mps"]))
    assert cfg.trace_columns == {"time": "when", "prompt": "in", "output": "out"} and cfg.trace_time_unit == "ms"
    assert cfg.trace_start_s == 0.5 and cfg.slo_regimes == ("paper", "tight")
    assert cfg.instances == ("bare", "static_mps@25", "static_mps@75", "deltaserve")
    every = config_from_args(ap.parse_args(["--device", "cuda", "--static-shares", "50"]))
    assert "split_pool" not in {n.split("@")[0] for n in every.instances}  # refused on one GPU: left out of "all"
    with pytest.raises(ValueError, match="distinct"):
        config_from_args(ap.parse_args(["--slo-regime", "paper,paper"]))


def test_the_report_counts_every_row(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n[1, 2]\n{"oops"\n'
                 '{"timestamp": 5, "input_length": 5, "output_length": 2}\n')
    r = read_trace_file(p, skip_bad=True).report
    assert (r["rows"], r["usable_rows"], r["bad_rows"], r["bad_lines"]) == (4, 2, 2, [2, 3])
