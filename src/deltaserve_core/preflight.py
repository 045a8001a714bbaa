"""Checks of a job against the model, the engine's limits and the job's own checkpoints, before anything starts.

:mod:`.job_config` validates a job on its own; what it cannot know is whether the target modules exist in *this*
model, whether the engine can hold the rank, and whether the checkpoint the job would resume from was trained with
the same adapter shape. Each of those used to surface only after the engine and the backward process had started
(as a tensor-size traceback, or not at all: an unknown module was silently skipped). Here they are read from files
alone -- the headers of the model's safetensors files (tensor names and shapes; without those, the model is built
on the meta device from its ``config.json``) and the checkpoint's JSON files -- without torch in the common case,
so a server refuses the job within seconds.

Called by ``deltaserve serve`` (and the engines' own server paths) right after the job file is read.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .job_config import JobConfig, JobConfigError

__all__ = ["ModelModules", "check_job", "check_local_files", "check_rank", "check_resume", "check_target_modules",
           "model_modules", "resume_fields"]

log = logging.getLogger("deltaserve.preflight")


@dataclass(frozen=True)
class ModelModules:
    """Module names of a causal LM, split by whether LoRA here can train them.

    ``layer_linears``: ``nn.Linear`` paths inside one decoder layer (``self_attn.q_proj``); ``other``: every other
    module path of the model (``model.embed_tokens``, ``lm_head``, the layers' norms)."""

    layer_linears: frozenset[str]
    other: frozenset[str]


_LAYER_WEIGHT = re.compile(r"^(?P<layers>(?:.+\.)?layers)\.(?P<idx>\d+)\.(?P<rest>.+)\.(?:weight|bias)$")


def _safetensors_header(path: Path) -> Mapping[str, Any]:
    # the format: 8 bytes little-endian header length, then a JSON object name -> {dtype, shape, data_offsets}
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size <= 100 * 2**20:
            raise ValueError(f"{path.name}: implausible safetensors header size {size}")
        return json.loads(f.read(size))


def modules_from_safetensors(model_dir: str | os.PathLike[str]) -> ModelModules | None:
    """:class:`ModelModules` from the checkpoint's safetensors headers alone (no torch, no transformers, no
    weights read): a 2-D weight inside ``...layers.<i>.`` is a linear layer; ``None`` without safetensors files."""
    d = Path(model_dir)
    shards = sorted(d.glob("*.safetensors"))
    if not shards:
        return None
    linears: set[str] = set()
    other: set[str] = set()
    for shard in shards:
        for name, meta in _safetensors_header(shard).items():
            if name == "__metadata__" or not isinstance(meta, Mapping):
                continue
            module = name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name
            m = _LAYER_WEIGHT.match(name)
            if m and name.endswith(".weight") and len(meta.get("shape") or ()) == 2:
                linears.add(m["rest"])
            else:
                other.add(module)
    try:
        config = json.loads((d / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if config.get("tie_word_embeddings"):
        other.add("lm_head")  # a tied head is no tensor of its own in the checkpoint, but a module of the model
    return ModelModules(frozenset(linears), frozenset(other))


def model_modules(model_dir: str | os.PathLike[str]) -> ModelModules:
    """Modules of the model of ``model_dir``: from its safetensors headers when it has them, else by building it
    on the meta device from its ``config.json`` (needs torch and transformers imported, but reads no weights)."""
    found = modules_from_safetensors(model_dir)
    if found is not None:
        return found
    return _modules_on_meta(model_dir)


def _modules_on_meta(model_dir: str | os.PathLike[str]) -> ModelModules:
    from accelerate import init_empty_weights
    from torch import nn
    from transformers import AutoConfig, AutoModelForCausalLM

    from .model_parts import decoder_parts

    config = AutoConfig.from_pretrained(str(model_dir))
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    _, layers, _, _, layers_path = decoder_parts(model)
    linears = {name.split(".", 1)[1] for name, m in layers.named_modules() if "." in name and isinstance(m, nn.Linear)}
    prefix = layers_path + "."
    other = {name for name, m in model.named_modules()
             if name and not (name.startswith(prefix) and isinstance(m, nn.Linear))}
    return ModelModules(frozenset(linears), frozenset(other))


def _matches(target: str, names: Iterable[str]) -> list[str]:
    # PEFT's rule for a list of target names: the module's path equals the target or ends with "." + target
    return sorted(n for n in names if n == target or n.endswith("." + target))


def check_target_modules(job: JobConfig, modules: ModelModules, model_label: str = "the model") -> list[str]:
    """Problems with ``lora.target_modules`` for a model with these ``modules`` (empty list: all fine)."""
    problems = []
    leaves = sorted({n.rsplit(".", 1)[-1] for n in modules.layer_linears})
    for target in job.lora.target_modules:
        if _matches(target, modules.layer_linears):
            continue
        if _matches(target, modules.other):
            problems.append(f"lora.target_modules: {target!r} is not a linear layer inside the decoder layers of "
                            f"{model_label} (LoRA here trains only those); use some of {leaves}")
        else:
            problems.append(f"lora.target_modules: {model_label} has no module {target!r}; its decoder-layer "
                            f"linears are {leaves}")
    return problems


def check_rank(job: JobConfig, max_lora_rank: int | None, how_to_raise: str = "") -> list[str]:
    """Problems with ``lora.r`` against the engine's ``max_lora_rank`` (``None``: unknown, nothing to check)."""
    if max_lora_rank is None or job.lora.r <= max_lora_rank:
        return []
    fix = f"; {how_to_raise}" if how_to_raise else ""
    return [f"lora.r: {job.lora.r} exceeds the engine's max_lora_rank {max_lora_rank}: lower lora.r to at most "
            f"{max_lora_rank}{fix}"]


def resume_fields(job: JobConfig) -> dict[str, Any]:
    """What a checkpoint records of the job so a later start can tell whether it may resume from it."""
    return {"r": job.lora.r, "lora_alpha": job.lora.lora_alpha, "target_modules": sorted(job.lora.target_modules),
            "max_length": job.max_length, "overflow": job.overflow, "dataset_format": job.dataset_format,
            "epochs": job.epochs, "seed": job.seed}


_CKPT = re.compile(r"^checkpoint-(\d{8,})$")


def _newest_checkpoint_files(directory: Path) -> tuple[Path, Mapping[str, Any], Mapping[str, Any]] | None:
    """``(folder, adapter_config, trainer_state)`` of the newest readable checkpoint, without loading tensors.

    Mirrors :func:`~deltaserve_core.checkpoint.load_latest`: a damaged newest folder is skipped for an older one."""
    if not directory.is_dir():
        return None
    found = sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _CKPT.match(p.name)) and p.is_dir())
    for _, folder in reversed(found):
        try:
            adapter = json.loads((folder / "adapter_config.json").read_text())
            state = json.loads((folder / "trainer_state.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(adapter, Mapping) and isinstance(state, Mapping):
            return folder, adapter, state
    return None


def check_resume(job: JobConfig) -> list[str]:
    """Problems resuming ``job`` from the newest checkpoint in ``checkpoint.dir`` (none there: nothing to check).

    The adapter's shape (r, alpha, target modules) is read from the checkpoint's ``adapter_config.json``; the data
    settings from what :func:`resume_fields` stored in its ``trainer_state.json`` (older checkpoints: the pool
    state's epochs and seed only)."""
    found = _newest_checkpoint_files(Path(job.checkpoint.dir))
    if found is None:
        return []
    folder, adapter, state = found
    extra = state.get("extra") if isinstance(state.get("extra"), Mapping) else {}
    saved: dict[str, Any] = {}
    pool = extra.get("pool")
    if isinstance(pool, Mapping):
        saved.update({k: pool[k] for k in ("epochs", "seed") if k in pool})
    if isinstance(extra.get("job"), Mapping):
        saved.update(extra["job"])
    saved.update({"r": adapter.get("r"), "lora_alpha": adapter.get("lora_alpha"),
                  "target_modules": sorted(adapter.get("target_modules") or [])})
    now = resume_fields(job)
    keys = {"r": "lora.r", "lora_alpha": "lora.alpha", "target_modules": "lora.target_modules",
            "max_length": "max_length", "overflow": "overflow", "dataset_format": "dataset_format",
            "epochs": "epochs", "seed": "seed"}
    problems = []
    for field, key in keys.items():
        if field not in saved or saved[field] is None:
            continue
        old, new = saved[field], now[field]
        same = float(old) == float(new) if field == "lora_alpha" else old == new
        if not same:
            problems.append(f"{key}: is {new!r} but the checkpoint this job resumes from ({folder}) was trained with "
                            f"{old!r}; set {key} back to {old!r}, or point checkpoint.dir at a new folder to start "
                            "over")
    return problems


def check_local_files(job: JobConfig) -> None:
    """The job's dataset exists and its checkpoint folder can be written (created if missing).

    Raises :class:`JobConfigError` naming ``dataset`` or ``checkpoint.dir``. A server calls this before it loads
    the engine: both used to fail only once the engine and the backward process were up."""
    if not Path(job.dataset).is_file():
        raise JobConfigError(f"job config: dataset: {job.dataset} does not exist; name an Alpaca or ShareGPT "
                             ".json/.jsonl file (relative paths are relative to the job file)")
    from .checkpoint import check_writable_dir

    try:
        check_writable_dir(job.checkpoint.dir, "checkpoint.dir")
    except ValueError as exc:
        raise JobConfigError(str(exc)) from exc.__cause__


def check_job(job: JobConfig, model_dir: str | os.PathLike[str] | None = None, *,
              max_lora_rank: int | None = None, how_to_raise_rank: str = "") -> None:
    """Every check of this module; raises :class:`JobConfigError` listing all problems found.

    ``model_dir``: a local model folder (``None`` or a folder without ``config.json``: the module check is skipped
    and the engine's own load reports it)."""
    problems = check_rank(job, max_lora_rank, how_to_raise_rank)
    if model_dir is not None and Path(model_dir, "config.json").is_file():
        try:
            modules = model_modules(model_dir)
        except (NotImplementedError, ValueError, OSError, KeyError, ImportError) as exc:
            log.warning("could not list the modules of %s without loading it (%s); lora.target_modules is checked "
                        "when the engine has loaded it", model_dir, exc)
        else:
            problems += check_target_modules(job, modules, f"model {Path(model_dir).name!r}")
    problems += check_resume(job)
    if len(problems) == 1:
        raise JobConfigError(f"job config: {problems[0]}")
    if problems:
        raise JobConfigError(f"job config: {len(problems)} problems:\n  " + "\n  ".join(problems))
