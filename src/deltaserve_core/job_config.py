"""The fine-tuning job an operator attaches to a host: one YAML file, the same for every engine.

Everything is validated when the file is read, before any engine or process starts, against one strict schema
(pydantic, below): no coercion of ``1.5`` or ``true`` into integers, only finite numbers, lists stay lists,
unknown keys refused, ``adapter_name`` a safe identifier. Each error names the key, the value and what would be
accepted. What needs the model or the checkpoint folder (target modules, the engine's rank limit, resuming) is
checked next, still before anything starts, by :mod:`.preflight`. Reading a job imports no torch.

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
    data_parallel:                         # optional: one job over N engine replicas (docs/scaling.md)
      world_size: 2                        # the rank comes from the engine or DELTASERVE_DP_RANK, not this file
      rendezvous: 10.0.0.1:29555           # host:port of the job's TCPStore; rank 0 hosts it (vllm serve
                                           # --data-parallel-size N on one node: both derived when left out)
      step_timeout_s: 60                   # a closed global step waits this long for a member's gradients
      claim_samples: 16                    # samples a rank takes from the global order at once
      keep_steps: 64                       # global steps kept in the store for a restarted rank to catch up
    share: {weight: 1, priority: 0}        # optional: several jobs on one host (docs/architecture.md, "Several
                                           # jobs"): fair share by weight among jobs of the highest ready priority
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from .lora_spec import LoraConfigSpec

__all__ = ["LATEST_SUFFIX", "JobConfig", "JobConfigError", "SLOSpec", "CheckpointSpec", "PublishSpec", "DataParallelSpec",
           "ShareSpec",
           "job_config_from_mapping", "job_config_to_mapping", "load_job_config"]

PUBLISH_POLICIES = ("never", "every_n_steps", "on_checkpoint")
#: ``dataset:`` value naming the Alpaca demo set (999 records), fetched once from the llamafactory sdist on PyPI.
BUILTIN_DEMO_DATASET = "builtin:alpaca-demo"
#: ``<adapter_name>@latest``: the model name that serves the newest published version, whichever step it is (both
#: servers; an adapter name cannot hold '@', so it never collides with a job's own name)
LATEST_SUFFIX = "@latest"


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
class DataParallelSpec:
    """One job over ``world_size`` engine replicas (:mod:`deltaserve_core.data_parallel`); 1 = off.

    The rank is not part of the job file (every replica reads the same file): it comes from the engine or the
    environment (``DELTASERVE_DP_RANK``), see :func:`deltaserve_core.data_parallel.resolve_rank`; an engine that runs
    the replicas itself fills in ``world_size`` and ``rendezvous`` (:func:`deltaserve_core.data_parallel.for_engine`)."""

    world_size: int = 1
    rendezvous: str = ""
    step_timeout_s: float = 60.0
    claim_samples: int = 16
    keep_steps: int = 64

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


@dataclass(frozen=True)
class ShareSpec:
    """How this job shares a host's harvested capacity with other jobs on it (:mod:`deltaserve_core.job_sharing`).

    ``weight``: among ready jobs of the same priority, fine-tuning tokens are shared in proportion to it.
    ``priority``: a ready job of a higher priority always goes first; lower ones get the steps it cannot use (while
    its backward runs, say). Both are inert for a job alone on its host."""

    weight: float = 1.0
    priority: int = 0


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
    data_parallel: DataParallelSpec = field(default_factory=DataParallelSpec)
    share: ShareSpec = field(default_factory=ShareSpec)

    def __post_init__(self) -> None:
        def need(cond: bool, key: str, msg: str) -> None:
            if not cond:
                raise JobConfigError(f"job config: {key}: {msg}")

        # numbers.* rather than int/float: code that builds a JobConfig may hand numpy scalars
        def whole(value: object) -> bool:
            return isinstance(value, numbers.Integral) and not isinstance(value, bool)

        def finite(value: object) -> bool:
            return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))

        # Repeats the schema's ranges for JobConfigs built in code (demo, benchmarks), which skip the schema.
        need(isinstance(self.dataset, str) and bool(self.dataset), "dataset",
             "is required: the path of an Alpaca or ShareGPT .json/.jsonl file")
        need(isinstance(self.adapter_name, str) and bool(_ADAPTER_NAME.fullmatch(self.adapter_name))
             and not self.adapter_name.startswith(_RESERVED_PREFIX), "adapter_name",
             f"{self.adapter_name!r} is not a safe name: use letters, digits, '.', '_' or '-', starting with a "
             "letter or digit")
        need(finite(self.lr) and self.lr > 0, "optimizer.lr", f"must be a positive finite number, got {self.lr!r}")
        need(finite(self.weight_decay) and self.weight_decay >= 0, "optimizer.weight_decay",
             f"must be a finite number >= 0, got {self.weight_decay!r}")
        need(whole(self.epochs) and self.epochs >= 1, "epochs", f"must be an integer >= 1, got {self.epochs!r}")
        need(whole(self.seed) and self.seed >= 0, "seed", f"must be an integer >= 0, got {self.seed!r}")
        need(whole(self.backward_batch_tokens) and self.backward_batch_tokens > 0, "backward_batch_tokens",
             f"must be an integer > 0, got {self.backward_batch_tokens!r}")
        need(whole(self.pack_tokens) and self.pack_tokens >= 0, "pack_tokens",
             f"must be an integer >= 0 (0: one sample per backward unit), got {self.pack_tokens!r}")
        need(whole(self.max_length) and self.max_length >= 2, "max_length",
             f"must be an integer >= 2 tokens, got {self.max_length!r}")
        need(self.overflow in ("truncate", "skip"), "overflow", f"must be 'truncate' or 'skip', got {self.overflow!r}")
        need(whole(self.buffer_tokens) and self.buffer_tokens > 0, "buffer_tokens",
             f"must be an integer > 0 (activation buffer size in tokens), got {self.buffer_tokens!r}")
        need(self.buffer_tokens >= min(self.max_length, self.backward_batch_tokens), "buffer_tokens",
             f"({self.buffer_tokens}) must hold at least one sample of max_length or one backward batch; raise it")
        need(finite(self.slo.ttft_s) and self.slo.ttft_s > 0, "slo.ttft_s",
             f"must be > 0 seconds, got {self.slo.ttft_s}")
        need(finite(self.slo.tpot_s) and self.slo.tpot_s > 0, "slo.tpot_s",
             f"must be > 0 seconds, got {self.slo.tpot_s}")
        need(self.slo.avg_tpot_s is None or (finite(self.slo.avg_tpot_s) and self.slo.avg_tpot_s > 0), "slo.avg_tpot_s",
             f"must be > 0 seconds or null, got {self.slo.avg_tpot_s}")
        need(self.checkpoint.every_steps >= 0, "checkpoint.every_steps", "must be >= 0 (0 disables periodic checkpoints)")
        need(self.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1")
        need(self.publish.policy in PUBLISH_POLICIES, "publish.policy",
             f"must be one of {', '.join(PUBLISH_POLICIES)}, got {self.publish.policy!r}")
        need(self.publish.policy != "every_n_steps" or self.publish.every_steps > 0, "publish.every_steps",
             "must be > 0 when publish.policy is every_n_steps")
        need(self.dataset_format in ("auto", "alpaca", "sharegpt"), "dataset_format",
             f"must be auto, alpaca or sharegpt, got {self.dataset_format!r}")
        need(finite(self.share.weight) and self.share.weight > 0, "share.weight",
             f"must be a positive finite number (a job's share relative to the others'), got {self.share.weight!r}; "
             "use e.g. 1 or 2")
        need(whole(self.share.priority), "share.priority",
             f"must be an integer (higher goes first), got {self.share.priority!r}; use e.g. 0 or 1")
        dp = self.data_parallel
        need(whole(dp.world_size) and dp.world_size >= 1, "data_parallel.world_size",
             f"must be an integer >= 1 (1: one replica), got {dp.world_size!r}")
        # may be left out: an engine that runs the replicas itself supplies it (data_parallel.for_engine); separate
        # servers without it are refused when a replica starts (data_parallel.resolve_rank)
        need(not dp.rendezvous or _RENDEZVOUS.fullmatch(dp.rendezvous) is not None, "data_parallel.rendezvous",
             f"must be host:port of the job's store (rank 0 hosts it), e.g. 10.0.0.1:29555, got {dp.rendezvous!r}")
        need(finite(dp.step_timeout_s) and dp.step_timeout_s > 0, "data_parallel.step_timeout_s",
             f"must be a positive number of seconds, got {dp.step_timeout_s!r}")
        need(whole(dp.claim_samples) and dp.claim_samples >= 1, "data_parallel.claim_samples",
             f"must be an integer >= 1, got {dp.claim_samples!r}")
        # a rank whose backward restarts from its newest checkpoint replays the global steps after it from the store
        need(whole(dp.keep_steps) and (dp.world_size == 1 or dp.keep_steps > self.checkpoint.every_steps > 0),
             "data_parallel.keep_steps",
             f"({dp.keep_steps!r}) must be an integer above checkpoint.every_steps ({self.checkpoint.every_steps}, "
             "which must be > 0 with data parallelism): a restarted rank replays the steps since its last checkpoint "
             "from the store; raise keep_steps or checkpoint more often")


# ---------------------------------------------------------------------------------------------- the schema
#
# One pydantic schema for the YAML mapping. Strict types, because lax coercion is exactly what let `r: true`,
# `epochs: 1.5` and `target_modules: "q_proj"` through before (the last one split into letters). Each field's
# description doubles as the "fix" half of its error message, so the rule and its explanation cannot drift apart.


def _number(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false")
    if isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads `1e-3` (no dot) as a string; a number written so is still a number
        except ValueError:
            raise ValueError("must be a number") from None
    return value


_Number = Annotated[float, BeforeValidator(_number)]
_PosNumber = Annotated[_Number, Field(gt=0, allow_inf_nan=False)]
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
#: what an adapter name may be: it becomes part of published version names (`<name>@v<step>`) and of folder names
_ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _module_name(value: str) -> str:
    if not _MODULE.fullmatch(value):
        raise ValueError(f"{value!r} is not a module name")
    return value


#: names DeltaServe keeps for itself (hooks.RESERVED_ADAPTER_NAME among them; importing hooks would import torch)
_RESERVED_PREFIX = "__deltaserve"
#: data_parallel.rendezvous: host:port (a host name, an IPv4 address or a bracketed IPv6 address)
_RENDEZVOUS = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):([1-9][0-9]{0,4})")


def _adapter_name(value: str) -> str:
    if value.startswith(_RESERVED_PREFIX):
        raise ValueError("is reserved for DeltaServe's internal fine-tuning adapter")
    if not _ADAPTER_NAME.fullmatch(value):
        raise ValueError("is not a safe name")
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _LoraSchema(_Section):
    r: int = Field(8, gt=0, description="a positive integer rank, e.g. 8 or 16")
    alpha: _PosNumber = Field(16.0, description="a positive number, e.g. 16 (scaling is alpha / r)")
    target_modules: list[Annotated[str, AfterValidator(_module_name)]] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1,
        description="a YAML list of linear module names inside the decoder layers, e.g. [q_proj, v_proj]")
    dropout: Annotated[_Number, Field(ge=0, lt=1, allow_inf_nan=False)] = Field(
        0.0, description="a number in [0, 1)")


class _OptimizerSchema(_Section):
    lr: _PosNumber = Field(1e-3, description="a positive finite learning rate, e.g. 1.0e-3")
    weight_decay: Annotated[_Number, Field(ge=0, allow_inf_nan=False)] = Field(
        0.01, description="a finite number >= 0, e.g. 0.01")


class _SLOSchema(_Section):
    ttft_s: _PosNumber = Field(1.0, description="a positive number of seconds, e.g. 1.0")
    tpot_s: _PosNumber = Field(0.2, description="a positive number of seconds, e.g. 0.2")
    avg_tpot_s: _PosNumber | None = Field(None, description="a positive number of seconds, or null")


class _CheckpointSchema(_Section):
    dir: str = Field("runs/deltaserve", min_length=1, description="a folder path (relative to the job file)")
    every_steps: int = Field(20, ge=0, description="an integer >= 0 (0 disables periodic checkpoints)")
    keep: int = Field(3, ge=1, description="an integer >= 1")


class _PublishSchema(_Section):
    policy: Literal["never", "every_n_steps", "on_checkpoint"] = Field(
        "on_checkpoint", description="one of never, every_n_steps, on_checkpoint")
    every_steps: int = Field(0, ge=0, description="an integer >= 0 (> 0 with policy every_n_steps)")


class _DataParallelSchema(_Section):
    world_size: int = Field(1, ge=1, description="an integer >= 1 (the number of engine replicas; 1: off)")
    rendezvous: str = Field("", description="host:port of the job's store, hosted by rank 0, e.g. 10.0.0.1:29555")
    step_timeout_s: _PosNumber = Field(60.0, description="a positive number of seconds, e.g. 60")
    claim_samples: int = Field(16, ge=1, description="an integer >= 1, e.g. 16")
    keep_steps: int = Field(64, ge=1, description="an integer above checkpoint.every_steps, e.g. 64")


class _ShareSchema(_Section):
    weight: _PosNumber = Field(1.0, description="a positive number, the job's share relative to the others', e.g. 1 "
                                                "or 2")
    priority: int = Field(0, description="an integer; a ready job of a higher priority goes first, e.g. 0 or 1")


class _JobSchema(_Section):
    dataset: str = Field(min_length=1, description="the path of an Alpaca or ShareGPT .json/.jsonl file, or "
                                                   f"{BUILTIN_DEMO_DATASET}")
    adapter_name: Annotated[str, AfterValidator(_adapter_name)] = Field(
        "deltaserve-adapter", description="1-128 letters, digits, '.', '_' or '-', starting with a letter or digit "
                                          "(no '@', '/', spaces); it names the published versions <name>@v<step>")
    lora: _LoraSchema = Field(default_factory=_LoraSchema, description="a mapping: {r, alpha, target_modules, dropout}")
    optimizer: _OptimizerSchema = Field(default_factory=_OptimizerSchema, description="a mapping: {lr, weight_decay}")
    epochs: int = Field(1, ge=1, description="a whole number of epochs >= 1")
    backward_batch_tokens: int = Field(256, gt=0, description="a positive integer number of tokens, e.g. 256")
    pack_tokens: int = Field(2048, ge=0, description="an integer >= 0 (0: one sample per backward unit)")
    max_length: int = Field(512, ge=2, description="an integer number of tokens >= 2")
    overflow: Literal["truncate", "skip"] = Field("truncate", description="truncate or skip")
    buffer_tokens: int = Field(4096, gt=0, description="a positive integer number of tokens (activation buffer)")
    slo: _SLOSchema = Field(default_factory=_SLOSchema, description="a mapping: {ttft_s, tpot_s, avg_tpot_s}")
    checkpoint: _CheckpointSchema = Field(default_factory=_CheckpointSchema,
                                          description="a mapping: {dir, every_steps, keep}")
    publish: _PublishSchema = Field(default_factory=_PublishSchema, description="a mapping: {policy, every_steps}")
    dataset_format: Literal["auto", "alpaca", "sharegpt"] = Field("auto", description="auto, alpaca or sharegpt")
    seed: int = Field(0, ge=0, description="an integer >= 0")
    data_parallel: _DataParallelSchema = Field(
        default_factory=_DataParallelSchema,
        description="a mapping: {world_size, rendezvous, step_timeout_s, claim_samples, keep_steps}")
    share: _ShareSchema = Field(default_factory=_ShareSchema, description="a mapping: {weight, priority}")


_SECTIONS = ("lora", "optimizer", "slo", "checkpoint", "publish", "data_parallel", "share")


def _field_at(loc: tuple[Any, ...]) -> tuple[str, FieldInfo | None, type[BaseModel] | None]:
    """Dotted key of a pydantic error location, the schema field it names and the model that holds it."""
    model: type[BaseModel] | None = _JobSchema
    info: FieldInfo | None = None
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):  # a list index: target_modules[1]
            parts[-1] += f"[{item}]"
            continue
        parts.append(str(item))
        fields_ = model.model_fields if model is not None else {}
        info = fields_.get(str(item))
        if info is None:
            return ".".join(parts), None, model
        ann = info.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return ".".join(parts), info, None


def _explain(err: Mapping[str, Any]) -> str:
    key, info, parent = _field_at(tuple(err["loc"]))
    if err["type"] == "extra_forbidden":
        known = sorted((parent or _JobSchema).model_fields)
        name = str(err["loc"][-1])
        home = [sec for sec in _SECTIONS if parent is _JobSchema
                and name in _JobSchema.model_fields[sec].annotation.model_fields]  # type: ignore[union-attr]
        close = difflib.get_close_matches(name, known, n=1)
        hint = (f"; it belongs under {home[0]}: ({home[0]}.{name})" if home
                else f"; did you mean {close[0]!r}?" if close else "")
        return f"{key}: unknown key{hint} (known keys here: {', '.join(known)})"
    if err["type"] == "missing":
        return f"{key}: is required: {info.description if info is not None else 'add it'}"
    msg = str(err.get("msg", "is invalid"))
    msg = msg.removeprefix("Value error, ").replace("Input should be", "must be")
    msg = msg.replace("a valid integer", "an integer").replace("a valid ", "a ")
    value = err.get("input")
    fix = info.description if info is not None and info.description else None
    if key.endswith("]") and key.startswith("lora.target_modules"):
        fix = "a module name such as q_proj"
    return f"{key}: {msg}, got {value!r}" + (f"; use {fix}" if fix else "")


def job_config_from_mapping(raw: Mapping[str, Any], base_dir: Path | None = None) -> JobConfig:
    """Validate a parsed job mapping against the schema and build the :class:`JobConfig`.

    Raises :class:`JobConfigError` listing every problem, each with its dotted key, the value and the fix.
    Relative ``dataset`` and ``checkpoint.dir`` resolve against ``base_dir`` when given."""
    if not isinstance(raw, Mapping):
        raise JobConfigError(f"job config must be a mapping of keys to values, got {type(raw).__name__}")
    data = dict(raw)
    for key in _SECTIONS:  # `lora:` with nothing under it is YAML for null: the defaults
        if key in data and data[key] is None:
            data[key] = {}
    try:
        s = _JobSchema.model_validate(data)
    except ValidationError as exc:
        problems = [_explain(e) for e in exc.errors(include_url=False)]
        if len(problems) == 1:
            raise JobConfigError(f"job config: {problems[0]}") from None
        raise JobConfigError(f"job config: {len(problems)} problems:\n  " + "\n  ".join(problems)) from None
    dataset = s.dataset
    if dataset == BUILTIN_DEMO_DATASET:
        from .assets import demo_dataset_path

        dataset = str(demo_dataset_path())
    elif base_dir is not None and not os.path.isabs(dataset):
        dataset = str((base_dir / dataset).resolve())
    ckpt_dir = s.checkpoint.dir
    if base_dir is not None and not os.path.isabs(ckpt_dir):
        ckpt_dir = str((base_dir / ckpt_dir).resolve())
    try:
        lora = LoraConfigSpec(r=s.lora.r, lora_alpha=float(s.lora.alpha),
                              target_modules=tuple(dict.fromkeys(s.lora.target_modules)),
                              lora_dropout=float(s.lora.dropout))
    except ValueError as exc:  # pragma: no cover - the schema is stricter than LoraConfigSpec
        raise JobConfigError(f"job config: lora: {exc}") from exc
    return JobConfig(
        dataset=dataset, adapter_name=s.adapter_name, lora=lora, lr=float(s.optimizer.lr),
        weight_decay=float(s.optimizer.weight_decay), epochs=s.epochs, backward_batch_tokens=s.backward_batch_tokens,
        pack_tokens=s.pack_tokens, max_length=s.max_length, overflow=s.overflow, buffer_tokens=s.buffer_tokens,
        slo=SLOSpec(float(s.slo.ttft_s), float(s.slo.tpot_s),
                    None if s.slo.avg_tpot_s is None else float(s.slo.avg_tpot_s)),
        checkpoint=CheckpointSpec(ckpt_dir, s.checkpoint.every_steps, s.checkpoint.keep),
        publish=PublishSpec(s.publish.policy, s.publish.every_steps), dataset_format=s.dataset_format, seed=s.seed,
        data_parallel=DataParallelSpec(s.data_parallel.world_size, s.data_parallel.rendezvous,
                                       float(s.data_parallel.step_timeout_s), s.data_parallel.claim_samples,
                                       s.data_parallel.keep_steps),
        share=ShareSpec(float(s.share.weight), s.share.priority))


def job_config_to_mapping(job: JobConfig) -> dict[str, Any]:
    """The job as the YAML mapping an operator writes (the inverse of :func:`job_config_from_mapping`), for handing a
    job built in code to a process that reads job files (``vllm serve``'s plugin). Relative paths are made absolute
    against this process's working directory, where the job would have resolved them: a job file reads them
    relative to its own folder."""
    return {
        "dataset": job.dataset if job.dataset == BUILTIN_DEMO_DATASET else os.path.abspath(job.dataset), "adapter_name": job.adapter_name,
        "lora": {"r": job.lora.r, "alpha": job.lora.lora_alpha, "target_modules": list(job.lora.target_modules),
                 "dropout": job.lora.lora_dropout},
        "optimizer": {"lr": job.lr, "weight_decay": job.weight_decay},
        "epochs": job.epochs, "backward_batch_tokens": job.backward_batch_tokens, "pack_tokens": job.pack_tokens,
        "max_length": job.max_length, "overflow": job.overflow, "buffer_tokens": job.buffer_tokens,
        "slo": {"ttft_s": job.slo.ttft_s, "tpot_s": job.slo.tpot_s, "avg_tpot_s": job.slo.avg_tpot_s},
        "checkpoint": {"dir": os.path.abspath(job.checkpoint.dir), "every_steps": job.checkpoint.every_steps,
                       "keep": job.checkpoint.keep},
        "publish": {"policy": job.publish.policy, "every_steps": job.publish.every_steps},
        "dataset_format": job.dataset_format, "seed": job.seed,
        # only when on: a one-replica job's mapping stays what it was before data parallelism existed
        **({"data_parallel": {"world_size": job.data_parallel.world_size, "rendezvous": job.data_parallel.rendezvous,
                              "step_timeout_s": job.data_parallel.step_timeout_s,
                              "claim_samples": job.data_parallel.claim_samples,
                              "keep_steps": job.data_parallel.keep_steps}} if job.data_parallel.enabled else {}),
        # only when set: a job alone on its host has no share to state
        **({"share": {"weight": job.share.weight, "priority": job.share.priority}}
           if job.share != ShareSpec() else {}),
    }


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
