"""Bad job configs are refused before anything starts, with the key and the fix in the message."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltaserve_core.job_config import JobConfigError, job_config_from_mapping, job_config_to_mapping, load_job_config

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "job.yaml"


def _cfg(**over):  # noqa: ANN003, ANN202
    raw = {"dataset": "data.json", **over}
    return job_config_from_mapping(raw)


def test_defaults_follow_the_paper() -> None:
    cfg = _cfg()
    assert (cfg.lr, cfg.weight_decay, cfg.backward_batch_tokens) == (1e-3, 0.01, 256)
    assert cfg.pack_tokens == 2048  # ours, not the paper's: packed backward units (lora_backward.TrainerConfig)
    assert _cfg(pack_tokens=0).pack_tokens == 0  # one sample per unit, bit-identical to PEFT's loop


def test_full_mapping_parses() -> None:
    cfg = _cfg(lora={"r": 4, "alpha": 8, "target_modules": ["q_proj"], "dropout": 0.1},
               optimizer={"lr": 5e-4}, slo={"ttft_s": 2, "tpot_s": 0.1, "avg_tpot_s": 0.05},
               publish={"policy": "every_n_steps", "every_steps": 3}, checkpoint={"dir": "x", "every_steps": 0})
    assert cfg.lora.r == 4 and cfg.lora.target_modules == ("q_proj",) and cfg.lora.scaling == 2.0
    assert cfg.slo.avg_tpot_s == 0.05 and cfg.publish.every_steps == 3 and cfg.lr == 5e-4


@pytest.mark.parametrize("over, key", [
    ({"slo": {"ttft_s": 0}}, "slo.ttft_s"),
    ({"slo": {"tpot_s": -1}}, "slo.tpot_s"),
    ({"buffer_tokens": 0}, "buffer_tokens"),
    ({"epochs": 0}, "epochs"),
    ({"overflow": "wrap"}, "overflow"),
    ({"publish": {"policy": "sometimes"}}, "publish.policy"),
    ({"publish": {"policy": "every_n_steps"}}, "publish.every_steps"),
    ({"lora": {"r": 0}}, "lora"),
    ({"lora": {"rank": 8}}, "lora.rank"),
    ({"optimizer": {"lr": 0}}, "optimizer.lr"),
    ({"learning_rate": 1e-3}, "unknown key"),
    ({"dataset_format": "csv"}, "dataset_format"),
    ({"pack_tokens": -1}, "pack_tokens"),
])
def test_bad_values_name_the_key(over: dict, key: str) -> None:
    with pytest.raises(JobConfigError, match=key.replace(".", r"\.")):
        _cfg(**over)


@pytest.mark.parametrize("over", [
    {},
    {"lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"], "dropout": 0.1},
     "optimizer": {"lr": 5e-4, "weight_decay": 0.0}, "slo": {"ttft_s": 2, "tpot_s": 0.1, "avg_tpot_s": 0.05},
     "publish": {"policy": "every_n_steps", "every_steps": 3}, "checkpoint": {"dir": "/runs/x", "every_steps": 0,
     "keep": 2}, "epochs": 7, "overflow": "skip", "pack_tokens": 0, "dataset_format": "sharegpt", "seed": 3},
])
def test_a_job_written_back_to_yaml_reads_as_the_same_job(over: dict, tmp_path: Path) -> None:
    import yaml

    job = job_config_from_mapping({"dataset": "data/train.json", **over}, base_dir=tmp_path)
    path = tmp_path / "elsewhere" / "job.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(job_config_to_mapping(job)))
    assert load_job_config(path) == job


def test_missing_dataset() -> None:
    with pytest.raises(JobConfigError, match="dataset: is required"):
        job_config_from_mapping({"epochs": 1})


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(JobConfigError, match="does not exist"):
        load_job_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("dataset: [unclosed\n")
    with pytest.raises(JobConfigError, match="not valid YAML"):
        load_job_config(bad)


def test_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    f = tmp_path / "sub" / "job.yaml"
    f.parent.mkdir()
    f.write_text("dataset: data/train.jsonl\ncheckpoint: {dir: ckpt}\n")
    cfg = load_job_config(f)
    assert cfg.dataset == str(tmp_path / "sub" / "data" / "train.jsonl")
    assert cfg.checkpoint.dir == str(tmp_path / "sub" / "ckpt")


def test_example_job_is_valid(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("deltaserve_core.assets.demo_dataset_path", lambda *a, **k: tmp_path / "alpaca.json")
    cfg = load_job_config(EXAMPLE)
    assert cfg.dataset == str(tmp_path / "alpaca.json") and cfg.publish.policy == "on_checkpoint"
