"""Atomic training checkpoints: a PEFT adapter folder plus optimizer, step and job state.

Layout of one checkpoint (``<dir>/checkpoint-<step:08d>/``)::

    adapter_config.json          PEFT LoraConfig        } the folder itself is a PEFT / vLLM / SGLang LoRA adapter:
    adapter_model.safetensors    PEFT-keyed weights     } PeftModel.from_pretrained(base, folder) loads it
    optimizer.pt                 torch.save(optimizer.state_dict())   (absent if none was given)
    trainer_state.json           {"step", "adapter": {...}, "param_order", "extra": <controller's JSON>, ...}

A checkpoint is written into a hidden temporary folder next to its final place, every file fsync'ed, then renamed
into place (a rename within one filesystem is atomic), so a crash leaves either the complete checkpoint or none;
:func:`load_latest` ignores anything that is not a complete ``checkpoint-*`` folder. Only the newest ``keep_last``
are kept.

Written by the backward process (it owns the optimizer) when the controller asks; read by the backward process when
it restarts and by the controller (which stores the data pool's position in ``extra``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .adapter_state import LoraAdapterState, check_finite, write_safetensors
from .cleanup import pid_alive

__all__ = ["Checkpoint", "check_writable_dir", "clean_stale", "save_checkpoint", "load_latest", "load_checkpoint",
           "list_checkpoints"]

FORMAT = "deltaserve-checkpoint"
FORMAT_VERSION = 1
_NAME = re.compile(r"^checkpoint-(\d{8,})$")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read back from disk."""

    path: Path
    step: int
    adapter: LoraAdapterState
    optimizer_state: dict[str, Any] | None
    extra: dict[str, Any]
    trainer_state: dict[str, Any]


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints under ``directory``, oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    for child in d.iterdir():
        m = _NAME.match(child.name)
        if m and child.is_dir() and (child / "trainer_state.json").is_file():
            found.append((int(m.group(1)), child))
    return [p for _, p in sorted(found)]


def check_writable_dir(directory: str | os.PathLike[str], key: str = "checkpoint.dir") -> Path:
    """Create ``directory`` if needed and prove a file can be written, renamed and removed in it.

    Called before training starts: a folder every save would fail in (a file in its place, read-only, under
    ``/proc``) is refused then, naming ``key``, rather than discovered at the first checkpoint. Also removes what
    crashed writers left there (:func:`clean_stale`)."""
    root = Path(directory)
    probe = root / f".deltaserve-write-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        os.replace(probe, probe.with_suffix(".renamed"))
        probe.with_suffix(".renamed").unlink()
    except OSError as exc:
        for leftover in (probe, probe.with_suffix(".renamed")):
            try:
                leftover.unlink()
            except OSError:
                pass
        raise ValueError(f"job config: {key}: {str(directory)!r} is not a writable folder ({exc.strerror or exc}); "
                         f"checkpoints could not be saved there: name a folder this process can write") from exc
    clean_stale(root)
    return root


def clean_stale(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove half-written checkpoints and replaced ones of writers no longer running; returns what was removed."""
    removed = []
    root = Path(directory)
    if not root.is_dir():
        return removed
    for child in root.iterdir():
        m = re.match(r"^\.tmp-checkpoint-\d+-(\d+)-[0-9a-f]+$", child.name)
        stale = (m is not None and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1)))) \
            or child.name.startswith(".old-checkpoint-") or child.name.startswith(".deltaserve-write-test-")
        if stale:
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
            removed.append(child)
    return removed


def save_checkpoint(directory: str | os.PathLike[str], adapter_state: LoraAdapterState,
                    optimizer_state: Mapping[str, Any] | None, step: int, extra: Mapping[str, Any] | None = None,
                    *, keep_last: int = 3) -> Path:
    """Write checkpoint ``step`` atomically under ``directory`` and prune to the newest ``keep_last``.

    ``extra`` is any JSON-serialisable mapping (the controller puts the data pool's ``state_dict`` there); it is
    checked before anything is written, and so are the weights and the optimizer's moments: a NaN or infinity
    raises :class:`~deltaserve_core.adapter_state.NonFiniteAdapterError` and nothing is written. Saving a step that
    already exists replaces it. Returns the folder.
    Called by the backward process on the controller's ``save`` command (or by anyone holding an optimizer).
    """
    if keep_last < 1:
        raise ValueError("keep_last must be at least 1")
    extra_json = json.dumps(dict(extra or {}))  # fails early, before any file exists, if extra is not JSON-able
    _refuse_nonfinite(adapter_state, optimizer_state, step)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"checkpoint-{int(step):08d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in adapter_state.tensors.items()}
        write_safetensors(tmp / "adapter_model.safetensors", tensors, metadata={"format": "pt"})
        config = adapter_state.config.peft_config_dict(adapter_state.base_model_path)
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2))
        if optimizer_state is not None:
            torch.save(dict(optimizer_state), tmp / "optimizer.pt")
        state = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "step": int(step),
            "time": time.time(),
            "adapter": {"name": adapter_state.name, "version": adapter_state.version,
                        "base_model_path": adapter_state.base_model_path},
            "param_order": sorted(tensors),
            "has_optimizer": optimizer_state is not None,
            "extra": json.loads(extra_json),
        }
        # trainer_state.json is what marks a checkpoint complete, so it is written last
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
        for f in tmp.iterdir():
            _fsync_file(f)
        _fsync_dir(tmp)
        if final.exists():
            trash = root / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(root)[:-keep_last]:
        # out of sight in one rename before the slow delete: a reader (a resume, a copy) never sees a checkpoint
        # folder half deleted, which would look like a damaged one
        trash = root / f".old-{old.name}-{uuid.uuid4().hex[:8]}"
        try:
            os.replace(old, trash)
        except OSError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
    for stale in root.glob(".tmp-checkpoint-*"):  # leftovers of writers that crashed
        if f"-{os.getpid()}-" not in stale.name:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def _refuse_nonfinite(adapter_state: LoraAdapterState, optimizer_state: Mapping[str, Any] | None, step: int) -> None:
    # A NaN checkpoint is worse than none: it becomes what every restart resumes from and what gets published.
    check_finite(adapter_state.tensors, f"checkpoint {step}'s adapter")
    moments = {f"state[{pid}].{k}": v for pid, st in dict((optimizer_state or {}).get("state") or {}).items()
               for k, v in dict(st).items() if torch.is_tensor(v)}
    check_finite(moments, f"checkpoint {step}'s optimizer state")


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read one checkpoint folder written by :func:`save_checkpoint`."""
    p = Path(path)
    state = json.loads((p / "trainer_state.json").read_text())
    if state.get("format") != FORMAT:
        raise ValueError(f"{p} is not a DeltaServe checkpoint (trainer_state.json format={state.get('format')!r})")
    meta = state.get("adapter", {})
    adapter = LoraAdapterState.load_pretrained(p, name=meta.get("name"), version=int(meta.get("version", 0)))
    if meta.get("base_model_path") and not adapter.base_model_path:
        adapter = LoraAdapterState(adapter.name, adapter.version, adapter.config, adapter.tensors,
                                   meta["base_model_path"])
    opt = None
    if (p / "optimizer.pt").is_file():
        opt = torch.load(p / "optimizer.pt", map_location=map_location, weights_only=True)
    return Checkpoint(path=p, step=int(state["step"]), adapter=adapter, optimizer_state=opt,
                      extra=dict(state.get("extra") or {}), trainer_state=state)


def load_latest(directory: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> Checkpoint | None:
    """The newest complete checkpoint under ``directory``, or ``None`` if there is none.

    Called by the backward process when it (re)starts with ``resume=True`` and by the controller to restore the data
    pool. A newest folder that fails to load (e.g. truncated by a full disk) is skipped for the one before it.
    """
    for path in reversed(list_checkpoints(directory)):
        try:
            return load_checkpoint(path, map_location)
        except Exception as exc:  # a damaged newest checkpoint must not block resuming from an older one
            warnings.warn(f"skipping unreadable checkpoint {path}: {exc}", stacklevel=2)
            continue
    return None
