"""Everything wrong with a job is refused before an engine starts: the schema (types, ranges, names), the model's
modules, the engine's rank limit and the checkpoint it would resume from; bad dataset records are counted, never
fatal; `deltaserve serve` exits promptly and leaves no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from deltaserve_core.job_config import JobConfigError, job_config_from_mapping
from deltaserve_core.testing.servers import processes_with_env

ROOT = Path(__file__).resolve().parents[1]


def _cfg(**over: object):  # noqa: ANN202
    return job_config_from_mapping({"dataset": "data.json", **over})


# ---------------------------------------------------------------------------------------------- the schema


@pytest.mark.parametrize("over, key, value, fix", [
    ({"epochs": 1.5}, "epochs", "1.5", "whole number"),
    ({"epochs": 0}, "epochs", "0", ">= 1"),
    ({"epochs": True}, "epochs", "True", "whole number"),
    ({"seed": "x"}, "seed", "'x'", "integer"),
    ({"seed": -1}, "seed", "-1", ">= 0"),
    ({"lora": {"r": 8.5}}, "lora.r", "8.5", "positive integer"),
    ({"lora": {"r": True}}, "lora.r", "True", "positive integer"),
    ({"lora": {"r": 0}}, "lora.r", "0", "positive integer"),
    ({"lora": {"alpha": -2}}, "lora.alpha", "-2", "positive number"),
    ({"lora": {"dropout": 1.0}}, "lora.dropout", "1.0", "[0, 1)"),
    ({"lora": {"target_modules": "q_proj"}}, "lora.target_modules", "'q_proj'", "list"),
    ({"lora": {"target_modules": []}}, "lora.target_modules", "[]", "list"),
    ({"lora": {"target_modules": ["q_proj", 7]}}, "lora.target_modules[1]", "7", "module name"),
    ({"lora": {"target_modules": ["q proj"]}}, "lora.target_modules[0]", "'q proj'", "module name"),
    ({"optimizer": {"lr": "fast"}}, "optimizer.lr", "'fast'", "positive finite"),
    ({"optimizer": {"lr": float("inf")}}, "optimizer.lr", "inf", "positive finite"),
    ({"optimizer": {"lr": ".inf"}}, "optimizer.lr", "'.inf'", "positive finite"),
    ({"optimizer": {"lr": float("nan")}}, "optimizer.lr", "nan", "positive finite"),
    ({"optimizer": {"lr": -1e-3}}, "optimizer.lr", "-0.001", "positive finite"),
    ({"optimizer": {"lr": 0}}, "optimizer.lr", "0", "positive finite"),
    ({"optimizer": {"lr": True}}, "optimizer.lr", "True", "positive finite"),
    ({"optimizer": {"weight_decay": float("inf")}}, "optimizer.weight_decay", "inf", ">= 0"),
    ({"backward_batch_tokens": 0}, "backward_batch_tokens", "0", "positive integer"),
    ({"buffer_tokens": -5}, "buffer_tokens", "-5", "positive integer"),
    ({"max_length": 1}, "max_length", "1", ">= 2"),
    ({"pack_tokens": 1.5}, "pack_tokens", "1.5", ">= 0"),
    ({"slo": {"ttft_s": 0}}, "slo.ttft_s", "0", "positive number"),
    ({"slo": {"tpot_s": float("inf")}}, "slo.tpot_s", "inf", "positive number"),
    ({"checkpoint": {"keep": 0}}, "checkpoint.keep", "0", ">= 1"),
    ({"checkpoint": {"every_steps": -1}}, "checkpoint.every_steps", "-1", ">= 0"),
    ({"checkpoint": {"dir": ""}}, "checkpoint.dir", "''", "folder"),
    ({"publish": {"policy": "sometimes"}}, "publish.policy", "'sometimes'", "on_checkpoint"),
    ({"overflow": "wrap"}, "overflow", "'wrap'", "truncate or skip"),
    ({"dataset_format": "csv"}, "dataset_format", "'csv'", "sharegpt"),
    ({"dataset": 5}, "dataset", "5", ".jsonl"),
    ({"lora": [8]}, "lora", "[8]", "mapping"),
])
def test_bad_value_names_the_key_the_value_and_the_fix(over: dict, key: str, value: str, fix: str) -> None:
    with pytest.raises(JobConfigError) as info:
        _cfg(**over)
    msg = str(info.value)
    assert f"job config: {key}: " in msg and f"got {value}" in msg and fix in msg, msg
    assert "\n" not in msg  # one problem, one line


@pytest.mark.parametrize("over, key, hint", [
    ({"learning_rate": 1e-3}, "learning_rate", "known keys"),
    ({"lr": 1e-3}, "lr", "belongs under optimizer"),
    ({"target_modules": ["q_proj"]}, "target_modules", "belongs under lora"),
    ({"epoch": 2}, "epoch", "did you mean 'epochs'"),
    ({"lora": {"rank": 8}}, "lora.rank", "known keys here: alpha, dropout, r, target_modules"),
    ({"optimizer": {"momentum": 0.9}}, "optimizer.momentum", "known keys here: lr, weight_decay"),
    ({"slo": {"ttft": 1}}, "slo.ttft", "did you mean 'ttft_s'"),
])
def test_unknown_keys_are_refused_with_a_suggestion(over: dict, key: str, hint: str) -> None:
    with pytest.raises(JobConfigError, match="unknown key") as info:
        _cfg(**over)
    assert f"job config: {key}: unknown key" in str(info.value) and hint in str(info.value), str(info.value)


def test_several_problems_are_listed_together() -> None:
    with pytest.raises(JobConfigError) as info:
        _cfg(epochs=0, seed="x", lora={"r": 1.5})
    msg = str(info.value)
    assert "3 problems" in msg and "epochs" in msg and "seed" in msg and "lora.r" in msg


@pytest.mark.parametrize("name", ["", 123, "a@v3", "__deltaserve_finetune__", "__deltaserve_x", "../../evil", "a/b",
                                  "a\\b", "with space", "tab\there", ".hidden", "-dash-first", "x" * 129, None])
def test_unsafe_adapter_names_are_refused(name: object) -> None:
    with pytest.raises(JobConfigError, match="adapter_name"):
        _cfg(adapter_name=name)


@pytest.mark.parametrize("name", ["bot", "support-bot", "Bot_2.v1", "7up"])
def test_safe_adapter_names_pass(name: str) -> None:
    assert _cfg(adapter_name=name).adapter_name == name


def test_reserved_name_is_explained() -> None:
    with pytest.raises(JobConfigError, match="reserved"):
        _cfg(adapter_name="__deltaserve_finetune__")


def test_numbers_yaml_reads_as_strings_still_count() -> None:
    # YAML 1.1 (PyYAML) reads `1e-3` without a dot as a string; it is still the number the operator meant
    assert _cfg(optimizer={"lr": "1e-3"}).lr == 1e-3


def test_empty_sections_mean_defaults_and_ints_are_numbers() -> None:
    cfg = _cfg(lora=None, slo={"ttft_s": 2, "tpot_s": 1})
    assert cfg.lora.r == 8 and cfg.slo.ttft_s == 2.0 and isinstance(cfg.slo.ttft_s, float)


def test_yaml_inf_and_nan_are_refused_from_a_file(tmp_path: Path) -> None:
    from deltaserve_core.job_config import load_job_config

    for text in ("optimizer: {lr: .inf}", "optimizer: {lr: .nan}", "optimizer: {lr: -.inf}"):
        f = tmp_path / "job.yaml"
        f.write_text(f"dataset: d.json\n{text}\n")
        with pytest.raises(JobConfigError, match="optimizer.lr"):
            load_job_config(f)


def test_jobconfig_built_in_code_checks_too() -> None:
    from deltaserve_core.job_config import JobConfig

    with pytest.raises(JobConfigError, match="optimizer.lr"):
        JobConfig(dataset="d.json", lr=float("inf"))
    with pytest.raises(JobConfigError, match="epochs"):
        JobConfig(dataset="d.json", epochs=1.5)  # type: ignore[arg-type]
    with pytest.raises(JobConfigError, match="adapter_name"):
        JobConfig(dataset="d.json", adapter_name="../x")


def test_lora_spec_refuses_a_string_and_a_bool_rank() -> None:
    from deltaserve_core.adapter_state import LoraConfigSpec

    with pytest.raises(ValueError, match="string"):
        LoraConfigSpec(target_modules="q_proj")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive integer"):
        LoraConfigSpec(r=True)


# ---------------------------------------------------------------------------------------------- against the model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from deltaserve_core.testing.tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("validate") / "model", num_layers=2, hidden_size=64,
                            num_heads=4, num_kv_heads=2, intermediate_size=128)


def test_model_modules_lists_decoder_linears_without_weights(model_dir: Path) -> None:
    from deltaserve_core.preflight import model_modules

    mods = model_modules(model_dir)
    assert {"self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"} <= mods.layer_linears
    assert "lm_head" in mods.other and "model.embed_tokens" in mods.other


def test_without_safetensors_the_model_is_built_on_the_meta_device(model_dir: Path, tmp_path: Path) -> None:
    import shutil

    from deltaserve_core.preflight import model_modules, modules_from_safetensors

    bare = tmp_path / "config-only"
    bare.mkdir()
    shutil.copy(model_dir / "config.json", bare / "config.json")
    assert modules_from_safetensors(bare) is None
    assert model_modules(bare).layer_linears == model_modules(model_dir).layer_linears


@pytest.mark.parametrize("targets, needle", [
    (["q_proj", "nonexistent"], "has no module 'nonexistent'"),
    (["embed_tokens"], "'embed_tokens' is not a linear layer inside"),
    (["lm_head"], "'lm_head' is not a linear layer inside"),
    (["input_layernorm"], "'input_layernorm' is not a linear layer inside"),
])
def test_target_modules_not_in_the_model_are_refused(model_dir: Path, targets: list[str], needle: str) -> None:
    from deltaserve_core.preflight import check_job

    job = _cfg(lora={"target_modules": targets}, checkpoint={"dir": str(model_dir.parent / "none")})
    with pytest.raises(JobConfigError, match="lora.target_modules") as info:
        check_job(job, model_dir)
    assert needle in str(info.value) and "q_proj" in str(info.value)  # and what would be accepted


def test_both_outside_modules_are_listed(model_dir: Path) -> None:
    from deltaserve_core.preflight import check_job

    job = _cfg(lora={"target_modules": ["embed_tokens", "lm_head"]}, checkpoint={"dir": str(model_dir / "none")})
    with pytest.raises(JobConfigError, match="2 problems"):
        check_job(job, model_dir)


def test_valid_targets_pass(model_dir: Path) -> None:
    from deltaserve_core.preflight import check_job

    job = _cfg(lora={"target_modules": ["q_proj", "self_attn.v_proj", "gate_proj"]},
               checkpoint={"dir": str(model_dir / "none")})
    check_job(job, model_dir, max_lora_rank=16)


def test_rank_above_the_engine_max_is_refused() -> None:
    from deltaserve_core.preflight import check_job

    job = _cfg(lora={"r": 32}, checkpoint={"dir": "/nonexistent-deltaserve-dir"})
    with pytest.raises(JobConfigError, match=r"lora.r: 32 exceeds the engine's max_lora_rank 16.*--max-lora-rank 32"):
        check_job(job, None, max_lora_rank=16, how_to_raise_rank="or start with --max-lora-rank 32")
    check_job(job, None, max_lora_rank=32)
    check_job(job, None)  # unknown limit: nothing to check


def _write_checkpoint(directory: Path, job) -> None:  # noqa: ANN001
    import torch

    from deltaserve_core.adapter_state import LoraAdapterState
    from deltaserve_core.checkpoint import save_checkpoint
    from deltaserve_core.preflight import resume_fields

    r = job.lora.r
    t = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(r, 64),
         "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(64, r)}
    save_checkpoint(directory, LoraAdapterState("bot", 4, job.lora, t), None, 4,
                    {"pool": {"epochs": job.epochs, "seed": job.seed}, "job": resume_fields(job)})


@pytest.mark.parametrize("change, key", [
    ({"lora": {"r": 4}}, "lora.r"),
    ({"lora": {"alpha": 32}}, "lora.alpha"),
    ({"lora": {"target_modules": ["q_proj"]}}, "lora.target_modules"),
    ({"max_length": 256}, "max_length"),
    ({"epochs": 3}, "epochs"),
    ({"seed": 9}, "seed"),
])
def test_resume_with_a_changed_adapter_or_data_shape_is_refused(tmp_path: Path, change: dict, key: str) -> None:
    from deltaserve_core.preflight import check_resume

    ckpt = {"dir": str(tmp_path / "ckpt")}
    _write_checkpoint(tmp_path / "ckpt", _cfg(checkpoint=ckpt))
    assert check_resume(_cfg(checkpoint=ckpt)) == []  # the same job resumes
    problems = check_resume(_cfg(checkpoint=ckpt, **change))
    assert len(problems) == 1 and problems[0].startswith(f"{key}: ") and "checkpoint.dir" in problems[0], problems


def test_no_checkpoint_nothing_to_check(tmp_path: Path) -> None:
    from deltaserve_core.preflight import check_resume

    assert check_resume(_cfg(checkpoint={"dir": str(tmp_path / "empty")})) == []


# ---------------------------------------------------------------------------------------------- dataset records


GOOD = {"instruction": "Say hi.", "input": "", "output": "Hi there."}
DEEP = '{"instruction": "a", "output": ' + "[" * 50000 + "]" * 50000 + "}"


def test_jsonl_bad_records_are_counted_with_their_line(tmp_path: Path) -> None:
    from deltaserve_core.finetune_data import load_records

    lines = [json.dumps(GOOD), '{"instruction": "\\ud800", "output": "x"}', DEEP, json.dumps(GOOD),
             '{"instruction": "ok", "output": "\\udfff tail"}', json.dumps(GOOD)]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    recs, report = load_records(path)
    assert [r.line for r in recs] == [1, 4, 6]
    assert [(p.line, p.kind) for p in report.problems] == [(2, "invalid_unicode"), (3, "too_deep"),
                                                           (5, "invalid_unicode")]


def test_a_bad_element_mid_list_does_not_drop_the_rest(tmp_path: Path) -> None:
    from deltaserve_core.finetune_data import load_records

    items = [json.dumps(GOOD), '{"instruction": oops, "output": "x"}', DEEP,
             '{"instruction": "\\ud800", "output": "y"}',
             json.dumps({**GOOD, "output": "with , and ] inside"}), json.dumps(GOOD)]
    path = tmp_path / "d.json"
    path.write_text("[\n" + ",\n".join(items) + "\n]\n")
    recs, report = load_records(path)
    assert [r.record_index for r in recs] == [0, 4, 5]
    assert [(p.index, p.kind) for p in report.problems] == [(1, "invalid_json"), (2, "too_deep"),
                                                            (3, "invalid_unicode")]
    assert "line 3" in report.problems[0].message and "still read" in report.problems[0].message
    assert report.records == 6 and report.malformed == 3


def test_whole_dataset_with_a_surrogate_tokenises_the_rest(tmp_path: Path, model_dir: Path) -> None:
    from deltaserve_core.finetune_data import DataConfig, FinetuneDataset

    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([json.dumps(GOOD), '{"instruction": "\\ud800", "output": "x"}',
                               json.dumps(GOOD), DEEP]) + "\n")
    ds = FinetuneDataset(DataConfig(path=path, max_length=64), str(model_dir))
    assert len(ds) == 2 and ds.report.malformed == 2


# ---------------------------------------------------------------------------------------------- serve


def test_a_failed_start_stops_the_backward_it_started() -> None:
    from deltaserve_core.coserve import CoServer

    calls: list[str] = []
    co = object.__new__(CoServer)
    co.host = SimpleNamespace(intercept_schedule=lambda x: calls.append("intercept"),
                              capture_activation=lambda x: calls.append("capture"),
                              report_step_time=lambda x: calls.append("report"))
    co.backward = None
    co.buffer = None
    co._started = False

    def failing_prepare() -> None:
        co.backward = SimpleNamespace(close=lambda: calls.append("backward.close"), kill=lambda: None)
        co.buffer = SimpleNamespace(close=lambda: calls.append("buffer.close"))
        raise ValueError("the checkpoint's pool was built from different samples")

    co._prepare = failing_prepare  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="different samples"):
        co.start()
    assert "backward.close" in calls and "buffer.close" in calls
    assert co.backward is None and co.buffer is None
    # the part on the host's thread (a created job prepared elsewhere, then attached) releases it too, hooks undone
    calls.clear()

    def failing_attach() -> CoServer:
        raise RuntimeError("the host refused the adapter")

    co._prepare = lambda: setattr(co, "backward", SimpleNamespace(  # type: ignore[method-assign]
        close=lambda: calls.append("backward.close"), kill=lambda: None))
    co._attach = failing_attach  # type: ignore[method-assign]
    co.prepare()
    with pytest.raises(RuntimeError, match="refused the adapter"):
        co.attach()
    assert calls == ["intercept", "capture", "report", "backward.close"] and co.backward is None


def _job_file(root: Path, name: str, body: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.json").write_text(json.dumps([GOOD] * 4))
    f = root / f"{name}.yaml"
    f.write_text(f"dataset: train.json\ncheckpoint: {{dir: ckpt-{name}}}\n{body}\n")
    return f


# Every refusal here imports no torch (module names come from the safetensors headers), so 10 s holds even on a
# loaded 2-core machine.
@pytest.mark.parametrize("name, body, needle, bound_s", [
    ("inf-lr", "optimizer: {lr: .inf}", "optimizer.lr", 10.0),
    ("string-targets", "lora: {target_modules: q_proj}", "lora.target_modules", 10.0),
    ("rank", "lora: {r: 64}", "--max-lora-rank 64", 10.0),
    ("evil-name", "adapter_name: ../../evil", "adapter_name", 10.0),
    ("missing-module", "lora: {target_modules: [q_proj, nonexistent]}", "nonexistent", 10.0),
    ("outside-modules", "lora: {target_modules: [embed_tokens]}", "embed_tokens", 10.0),
])
def test_serve_with_a_bad_job_exits_non_zero_quickly_leaving_no_process(tmp_path: Path, model_dir: Path, name: str,
                                                                        body: str, needle: str,
                                                                        bound_s: float) -> None:
    job = _job_file(tmp_path, name, body)
    marker = f"DELTASERVE_TEST_MARK={uuid.uuid4().hex}"
    key, value = marker.split("=")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"), **{key: value})
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "deltaserve_core.cli", "serve", "--host", "vllm",
                           str(model_dir), "--job", str(job), "--port", "0"], capture_output=True, text=True,
                          timeout=60, env=env, check=False)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert needle in proc.stderr, proc.stderr
    assert elapsed < bound_s, f"took {elapsed:.1f} s to refuse the job"
    assert processes_with_env(marker) == [], "a process of the refused server is still running"


def test_serve_refuses_to_resume_with_a_changed_rank_fast(tmp_path: Path, model_dir: Path) -> None:
    job = _job_file(tmp_path, "resume", "lora: {r: 4}")
    from deltaserve_core.job_config import load_job_config

    _write_checkpoint(tmp_path / "ckpt-resume", load_job_config(job))
    job.write_text(job.read_text().replace("r: 4", "r: 8"))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "deltaserve_core.cli", "serve", "--host", "vllm",
                           str(model_dir), "--job", str(job), "--port", "0"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), check=False)
    assert proc.returncode == 2 and "lora.r: is 8 but the checkpoint" in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 10.0


def test_the_reserved_fine_tuning_name_is_under_the_refused_prefix() -> None:
    from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
    from deltaserve_core.job_config import _RESERVED_PREFIX

    assert RESERVED_ADAPTER_NAME.startswith(_RESERVED_PREFIX)
