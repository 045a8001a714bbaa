"""`deltaserve calibrate`: a real calibration of the reference host on the tiny model, reuse, JSON, bad input.

Sweep limits are tiny (prompts ≤ 64 tokens, 4 decodes) so a calibration takes well under a second; nothing here
asserts on timings.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from deltaserve_core.calibration_cli import add_calibrate_arguments, resolve_model, run_calibrate
from deltaserve_core.cli import main
from deltaserve_core.registry import UnknownHostError

SMALL = ["--max-prefill", "64", "--max-decode", "4", "--max-kv", "256", "--max-ft", "64", "--no-progress"]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_calibrate_arguments(parser)
    return parser.parse_args(list(argv))


def test_calibrate_reference_tiny_saves_profile_and_json(tmp_path: Path, tiny_model: Path,
                                                         capsys) -> None:  # noqa: ANN001
    store, out = tmp_path / "profiles", tmp_path / "out" / "calibration.json"
    assert run_calibrate(parse("--host", "reference", "--model", str(tiny_model), "--store", str(store),
                               "--json", str(out), *SMALL)) == 0
    text = capsys.readouterr().out
    assert "eager: in-sample MAPE" in text and "p95" in text and "n=" in text
    assert "profile saved to" in text and str(store) in text

    saved = list(store.glob("*.json"))
    assert len(saved) == 1
    summary = json.loads(out.read_text())
    assert summary["profile_path"] == str(saved[0]) and summary["reused"] is False
    assert summary["key"]["host"] == "reference" and summary["key"]["model"] == str(tiny_model)
    assert summary["key"]["device"] == "cpu" and summary["key"]["dtype"] == "float32"
    assert set(summary["modes"]) == {"eager"}  # the reference host has no graph mode
    eager = summary["modes"]["eager"]
    assert eager["quality"]["n"] + eager["quality"]["dropped"] == summary["steps"] > 0  # outliers are counted apart
    assert eager["equations"]["prefill"]["source"] == "fitted"
    assert set(eager["equations"]["prefill"]["coefficients"]) == {"alpha", "beta", "gamma", "eps", "c", "delta",
                                                                       "zeta", "eta"}
    assert set(eager["equations"]["decode"]["coefficients"]) == {"beta", "eps", "c"}
    assert summary["limits"] == {"max_prefill": 64, "max_decode": 4, "max_kv": 256, "max_ft": 64}


def test_calibrate_reuses_a_covering_profile_and_recalibrates_otherwise(tmp_path: Path, tiny_model: Path,
                                                                        capsys) -> None:  # noqa: ANN001
    common = ["--model", str(tiny_model), "--store", str(tmp_path)]
    assert run_calibrate(parse(*common, *SMALL)) == 0
    capsys.readouterr()

    assert run_calibrate(parse(*common, *SMALL)) == 0
    assert "reused the stored profile" in capsys.readouterr().out

    # A longer prompt limit than the stored profile reaches: reusing it would extrapolate Equation I.
    wider = [a if a != "64" else "128" for a in SMALL]
    assert run_calibrate(parse(*common, *wider)) == 0
    captured = capsys.readouterr()
    assert "does not cover" in captured.err and "prefill tokens per step 128" in captured.err
    assert "profile saved to" in captured.out

    assert run_calibrate(parse(*common, *wider, "--force")) == 0
    assert "profile saved to" in capsys.readouterr().out


def test_bad_model_path_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="does not exist") as info:
        run_calibrate(parse("--model", str(missing), "--store", str(tmp_path), *SMALL))
    assert str(missing) in str(info.value) and "tiny, smollm2" in str(info.value)

    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        run_calibrate(parse("--model", str(tmp_path / "empty"), "--store", str(tmp_path), *SMALL))


def test_cli_turns_bad_input_into_one_line_and_status_2(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main(["calibrate", "--model", str(tmp_path / "nope"), "--store", str(tmp_path), *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("deltaserve calibrate: model path") and "does not exist" in err
    assert len(err.splitlines()) == 1

    assert main(["calibrate", "--host", "no-such-host", "--model", "tiny", *SMALL]) == 2
    assert "no DeltaServe host named 'no-such-host'" in capsys.readouterr().err


def test_unknown_host_and_bad_limits_fail_before_any_model_is_built(tmp_path: Path) -> None:
    # A model path that does not exist proves the host/limit checks ran first.
    with pytest.raises(UnknownHostError, match="no-such-host"):
        run_calibrate(parse("--host", "no-such-host", "--model", str(tmp_path / "x"), *SMALL))
    with pytest.raises(ValueError, match="--max-prefill must be a positive integer"):
        run_calibrate(parse("--model", str(tmp_path / "x"), "--max-prefill", "0"))
    with pytest.raises(ValueError, match="CUDA is not available|does not exist"):
        if not _cuda():
            run_calibrate(parse("--model", str(tmp_path / "x"), "--device", "cuda", *SMALL))
        else:
            run_calibrate(parse("--model", str(tmp_path / "x"), "--device", "cuda:999", *SMALL))


def test_tiny_shortcut_builds_once_under_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELTASERVE_CACHE", str(tmp_path))
    path = resolve_model("tiny")
    assert path == tmp_path / "models" / "tiny-llama" and (path / "config.json").is_file()
    assert resolve_model("tiny") == path  # the second call reuses the folder


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
