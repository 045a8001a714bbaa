"""The offline test checkpoints are shared by test workers, suite runs and demos through one cache folder: builders
may race, and a reader must never see half a folder."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import multiprocessing as mp  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from deltaserve_core.testing.tiny_model import build_lora_adapter, build_tiny_llama  # noqa: E402

SMALL = {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}


def _build(root: str) -> list[str]:
    model = build_tiny_llama(Path(root) / "model", **SMALL)
    adapter = build_lora_adapter(model, Path(root) / "adapter", r=2)
    return sorted(p.name for p in model.iterdir()) + sorted(p.name for p in adapter.iterdir())


def test_concurrent_builders_of_one_folder_all_get_the_whole_folder(tmp_path: Path) -> None:
    with mp.get_context("spawn").Pool(2) as pool:
        listings = pool.map(_build, [str(tmp_path)] * 2)
    assert listings[0] == listings[1]
    assert "model.safetensors" in listings[0] and "adapter_model.safetensors" in listings[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "model"], "a builder left its staging folder"


def test_other_settings_replace_the_folder_and_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    first = build_tiny_llama(tmp_path / "model", **SMALL)
    stamp = (first / "deltaserve_tiny.json").read_text()
    again = build_tiny_llama(tmp_path / "model", **{**SMALL, "seed": 3})
    assert again == first and (again / "deltaserve_tiny.json").read_text() != stamp
    with pytest.raises(OSError):
        build_lora_adapter(tmp_path / "missing-model", tmp_path / "adapter")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
