"""`deltaserve calibrate`: a real calibration of the reference host on the tiny model, reuse, JSON, bad input.

Sweep limits are tiny (prompts ≤ 64 tokens, 4 decodes) so a calibration takes well under a second; nothing here
asserts on timings.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deltaserve_core.assets import resolve_model
from deltaserve_core.calibration_cli import add_calibrate_arguments, run_calibrate
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
    assert path == tmp_path / "tiny-llama-demo" and (path / "config.json").is_file()
    assert resolve_model("tiny") == path  # the second call reuses the folder


class _HostConfigSeen(Exception):
    """Raised in place of building a host: the command got as far as naming the model it would load."""


def _model_the_command_loads(monkeypatch: pytest.MonkeyPatch, run: object, args: argparse.Namespace) -> str:
    def host_config(**kwargs: object) -> None:
        raise _HostConfigSeen(str(kwargs["model"]))

    monkeypatch.setattr("deltaserve_core.driver.HostConfig", host_config)
    with pytest.raises(_HostConfigSeen) as info:
        run(args)  # type: ignore[operator]
    return str(info.value)


def test_calibrate_tiny_profiles_the_model_serve_tiny_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`deltaserve calibrate --model tiny` once built another random Llama than `deltaserve serve tiny` loads, so
    its profile was keyed (and measured) on a model the server never ran."""
    from deltaserve_core.serve import add_serve_arguments, run_serve

    monkeypatch.setenv("DELTASERVE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "train.json").write_text(json.dumps([{"instruction": "Say hi.", "input": "", "output": "Hi."}]))
    job = tmp_path / "job.yaml"
    job.write_text(f"dataset: {tmp_path / 'train.json'}\nadapter_name: a\nslo: {{ttft_s: 5.0, tpot_s: 5.0}}\n"
                   f"checkpoint: {{dir: {tmp_path / 'ckpt'}}}\n")
    serve_parser = argparse.ArgumentParser()
    add_serve_arguments(serve_parser)

    calibrated = _model_the_command_loads(monkeypatch, run_calibrate,
                                          parse("--model", "tiny", "--store", str(tmp_path / "p"), *SMALL))
    served = _model_the_command_loads(monkeypatch, run_serve,
                                      serve_parser.parse_args(["tiny", "--job", str(job), "--port", "0"]))
    assert calibrated == served == str(resolve_model("tiny"))


def test_a_relative_model_folder_is_the_same_profile_key_as_its_absolute_path(
        tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tiny_model.parent)
    assert resolve_model(tiny_model.name) == resolve_model(str(tiny_model)) == tiny_model.resolve()


@pytest.fixture(scope="module")
def short_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny bfloat16 Llama whose context (128 tokens) is far below the sweep's caps: the defaults must fit it."""
    import torch

    from deltaserve_core.testing.tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("short") / "tiny-128", max_position_embeddings=128,
                            dtype=torch.bfloat16)


def test_defaults_come_from_the_model_config(tmp_path: Path, short_model: Path, capsys) -> None:  # noqa: ANN001
    store, out = tmp_path / "profiles", tmp_path / "calibration.json"
    assert run_calibrate(parse("--model", str(short_model), "--store", str(store), "--json", str(out),
                               "--max-decode", "4", "--max-ft", "64", "--no-progress")) == 0
    summary = json.loads(out.read_text())
    # the longest prompt leaves room for the token its prefill samples; a decode row for the 2 tokens it makes
    assert summary["limits"] == {"max_prefill": 127, "max_decode": 4, "max_kv": 126, "max_ft": 64}
    assert summary["key"]["dtype"] == "bfloat16"  # the model's own, not float32
    text = capsys.readouterr().out
    # the reference host has no server: no command, and a sentence saying so
    assert "deltaserve serve" not in text and "the reference host has no server of its own" in text, text


@pytest.mark.parametrize(("flag", "value", "fix"), [("--max-kv", "127", "--max-kv 126"),
                                                    ("--max-kv", "65536", "--max-kv 126"),
                                                    ("--max-prefill", "128", "--max-prefill 127")])
def test_limits_the_context_cannot_hold_are_refused_before_the_host_starts(
        short_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str, value: str, fix: str) -> None:
    def no_host(*args: object, **kwargs: object) -> None:
        raise AssertionError("the host was created before the limits were checked")

    monkeypatch.setattr("deltaserve_core.registry.create_host", no_host)
    with pytest.raises(ValueError) as info:
        run_calibrate(parse("--model", str(short_model), "--store", str(tmp_path), flag, value, "--no-progress"))
    message = str(info.value)
    assert f"{flag} {value} does not fit" in message and fix in message, message
    assert "context length 128" in message and "max_position_embeddings" in message, message


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None and not os.environ.get("DELTASERVE_REQUIRE_ENGINES"),
                    reason="vLLM is not installed (pip install 'deltaserve[vllm]')")
def test_vllm_calibrates_with_the_default_limits(tmp_path: Path) -> None:
    """`deltaserve calibrate --host vllm --model M` without --max-kv, --max-prefill or --dtype: their old defaults
    (65536 KV tokens, 2048-token prompts) exceeded the model's context and failed in vLLM's input checks. The decode
    batch and fine-tuning limits are set small only to keep the sweep short."""
    from deltaserve_core.testing.tiny_model import build_tiny_llama

    model = build_tiny_llama(tmp_path / "tiny-128-fp32", max_position_embeddings=128)
    run = subprocess.run([sys.executable, "-m", "deltaserve_core.cli", "calibrate", "--host", "vllm", "--model",
                          str(model), "--store", str(tmp_path / "profiles"), "--max-decode", "8", "--max-ft", "64",
                          "--no-progress"],
                         env=dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1"),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "profile saved to" in run.stdout
    served = [ln for ln in run.stdout.splitlines() if "--additional-config" in ln]
    assert len(served) == 1 and str(model) in served[0] and "--dtype float32" in served[0], run.stdout[-2000:]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
