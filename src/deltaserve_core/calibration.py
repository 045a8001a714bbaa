"""Offline calibration of the latency model: the profiling sweep of §3.3, its fit, and a profile store.

Who calls what: ``deltaserve calibrate --host H --model M`` (and the job start-up, when no stored profile
matches) calls :func:`load_or_calibrate`, which looks the host up in a :class:`ProfileStore`, and otherwise
runs :func:`build_sweep` → :func:`calibrate` → :meth:`ProfileStore.save`. :func:`calibrate` drives the host
only through :meth:`HostHooks.run_profile_step <deltaserve_core.hooks.HostHooks.run_profile_step>`, before
the host accepts client requests.

The sweep has the four families of shapes the paper names, for every execution mode the host has:

* ``prefill_length``: one prompt, total length swept geometrically -- pins β and c of Equation I;
* ``prefill_split``: a fixed total length split across 1..k requests -- Σnᵢ² changes while T_in does not,
  which separates α from β;
* ``decode_grid``: decode batch size × per-request KV length -- Equation II (β′, ε′, c′);
* ``finetune``: inference batches (none, a short and a mid-length prompt, and on mixed hosts a decode
  batch and a prompt with decodes) augmented with 0..S fine-tuning tokens in short and long samples -- γ,
  and the co-serving terms ζ, η (see :mod:`.latency_model`). Only in EAGER mode: a step carrying
  fine-tuning rows always runs eagerly.

On hosts with mixed batches a ``mixed`` family (prompts sharing the step with decode batches) adds the
B_d cross term and ε of Equation I.

Beyond the paper, a ``rows`` family pins δ, Equation I's per-row cost (see :mod:`.latency_model`). The
``prefill_split`` family varies the row count R at a fixed T_in, but Σnᵢ² falls as 1/k there while R grows
as k, so on a long total the quadratic term swamps δ. ``rows`` varies R where little else moves:

* k prompts of ``min_prefill`` tokens each, k = 1..``max_rows``: the step grows by (α m² + β m + δ) per row
  with a tiny m, so δ carries most of each added row, while ``prefill_length`` (R = 1 throughout) pins
  α, β and c;
* on mixed hosts, one ``min_prefill`` prompt plus B_d decodes at the shortest context, each *paired* with
  a lone prompt of ``min_prefill + B_d`` tokens: the two have the same Σ(nᵢ+B_d)² and T_in + B_d, so they
  differ only by ε K (small, and pinned by the ``mixed`` family) and δ B_d.

The fine-tuning family's short and long samples at equal totals vary R as well, on the eager side.

``max_prefill_tokens`` is the host's per-step token budget for prompt rows (inference and fine-tuning
together); fine-tuning shapes keep their inference prompt plus fine-tuning tokens within it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import tempfile
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .adapter_state import LoraConfigSpec
from .latency_model import Equation, FitQuality, LatencyModel
from .types import ExecutionMode, HostCapabilities, ProfileShape, StepRecord

if TYPE_CHECKING:  # hooks imports torch; calibration itself does not need it
    from .hooks import HostHooks

__all__ = [
    "CalibrationError",
    "ProfileKey",
    "CalibrationProfile",
    "ProfileStore",
    "build_sweep",
    "calibrate",
    "load_or_calibrate",
    "format_quality",
    "default_profile_dir",
    "PROFILE_FORMAT",
]

PROFILE_FORMAT = "deltaserve.calibration_profile"
# Version 2: Equation I has the per-row term δ (a version-1 profile lacks it and is refused: recalibrate).
_PROFILE_VERSION = 2


class CalibrationError(RuntimeError):
    """Calibration could not run or produced no usable model; the message names the host and what to fix."""


# ---------------------------------------------------------------------------------------------- the sweep


def _geometric(lo: int, hi: int, points: int) -> list[int]:
    """Up to ``points`` distinct integers from ``lo`` to ``hi`` (both included), evenly spaced in log."""
    if hi <= lo:
        return [max(lo, hi)]
    if points <= 1:
        return [hi]
    ratio = (hi / lo) ** (1.0 / (points - 1))
    values = sorted({min(hi, max(lo, round(lo * ratio**i))) for i in range(points)} | {lo, hi})
    return values


def _split(total: int, parts: int) -> tuple[int, ...]:
    base, extra = divmod(total, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))


def _ft_samples(total: int, sample_len: int) -> tuple[int, ...]:
    """``total`` fine-tuning tokens as samples of ``sample_len`` (last one shorter; every sample ≥ 2 tokens)."""
    if total <= 0:
        return ()
    full, rest = divmod(total, sample_len)
    lengths = [sample_len] * full
    if rest >= 2:
        lengths.append(rest)
    elif rest and lengths:
        lengths[-1] += rest
    return tuple(lengths) if lengths else ((total,) if total >= 2 else ())


def build_sweep(
    capabilities: HostCapabilities,
    max_prefill_tokens: int,
    max_decode_batch: int,
    max_kv: int,
    max_ft_tokens: int,
    *,
    points: int = 8,
    max_split: int = 16,
    min_prefill: int = 16,
    repeats: int = 1,
    max_rows: int | None = None,
) -> list[ProfileShape]:
    """The calibration shapes for a host (see the module docs for the families).

    ``max_kv`` bounds the total KV tokens of a decode batch (per-request context = K / B_d);
    ``max_ft_tokens`` is capped by ``capabilities.max_finetune_tokens_per_step``; ``points`` is the number
    of values per swept axis; ``repeats`` is stored in each shape (:func:`calibrate` runs a shape that
    many times, each run one record); ``max_rows`` bounds the prompt count of the ``rows`` family (default
    ``max(max_split, max_decode_batch)``, and never more prompts of ``min_prefill`` tokens than fit in
    ``max_prefill_tokens``). Every shape carries a ``tags`` entry naming its family.
    """
    for name, value in (("max_prefill_tokens", max_prefill_tokens), ("max_decode_batch", max_decode_batch),
                        ("max_kv", max_kv), ("points", points), ("max_split", max_split), ("repeats", repeats)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"build_sweep: {name} must be a positive integer, got {value!r}")
    if max_rows is not None and (not isinstance(max_rows, int) or max_rows <= 0):
        raise ValueError(f"build_sweep: max_rows must be a positive integer, got {max_rows!r}")
    if not isinstance(max_ft_tokens, int) or max_ft_tokens < 0:
        raise ValueError(f"build_sweep: max_ft_tokens must be a non-negative integer, got {max_ft_tokens!r}")
    min_prefill = max(2, min(min_prefill, max_prefill_tokens))
    ft_cap = min(max_ft_tokens, capabilities.max_finetune_tokens_per_step, max_prefill_tokens)

    shapes: list[ProfileShape] = []

    def add(mode: ExecutionMode, tag: str, prefill: Sequence[int] = (), num_decode: int = 0, context: int = 0,
            ft: Sequence[int] = ()) -> None:
        if not prefill and not num_decode and not ft:
            return  # an empty step (the FT-only base with 0 FT tokens) is not a step
        shapes.append(ProfileShape(prefill_lengths=tuple(prefill), num_decode=num_decode,
                                   decode_context=context if num_decode else 0, finetune_lengths=tuple(ft),
                                   mode=mode, repeats=repeats, tags=(tag,)))

    lengths = _geometric(min_prefill, max_prefill_tokens, points)
    batch_sizes = _geometric(1, max_decode_batch, points)
    splits = [k for k in _geometric(1, max_split, points) if k <= max_prefill_tokens // 2 or k == 1]
    split_totals = sorted({max_prefill_tokens, max(min_prefill, max_prefill_tokens // 4)})
    mid_len = lengths[len(lengths) // 2]
    small_len = lengths[max(0, len(lengths) // 4)]
    row_cap = min(max_rows if max_rows is not None else max(max_split, max_decode_batch),
                  max(1, max_prefill_tokens // min_prefill))
    row_counts = _geometric(1, row_cap, points)

    def contexts(bd: int) -> list[int]:
        top = max(1, max_kv // bd)
        return _geometric(min(16, top), top, max(2, points // 2))

    for mode in sorted(capabilities.graph_modes, key=lambda m: m.value):
        for n in lengths:
            add(mode, "prefill_length", (n,))
        for total in split_totals:
            for k in splits:
                if total // k >= 1:
                    add(mode, "prefill_split", _split(total, k))
        for bd in batch_sizes:
            for ctx in contexts(bd):
                add(mode, "decode_grid", num_decode=bd, context=ctx)
        if capabilities.mixed_batches:
            for n in (small_len, mid_len):
                for bd in _geometric(1, max_decode_batch, max(2, points // 2)):
                    for ctx in (contexts(bd)[0], contexts(bd)[-1]):
                        add(mode, "mixed", (n,), bd, ctx)
        # δ (per-row cost): R varies while the token terms barely move (see the module docs).
        for k in row_counts:
            add(mode, "rows", (min_prefill,) * k)
        if capabilities.mixed_batches:
            for bd in batch_sizes:
                if min_prefill + bd <= max_prefill_tokens:
                    add(mode, "rows", (min_prefill,), bd, contexts(bd)[0])
                    add(mode, "rows", (min_prefill + bd,))  # same Σ(n+B_d)² and T_in+B_d, R = 1

    if ExecutionMode.EAGER in capabilities.graph_modes and ft_cap >= 2:
        mode = ExecutionMode.EAGER
        # Prompts of two lengths under fine-tuning: the co-serving term ζ·U (engines that run the LoRA path
        # over the whole batch) needs U to vary while fine-tuning rows are present.
        bases: list[tuple[tuple[int, ...], int, int]] = [((), 0, 0), ((small_len,), 0, 0), ((mid_len,), 0, 0)]
        if capabilities.mixed_batches:
            bd = batch_sizes[len(batch_sizes) // 2]
            bases += [((), bd, contexts(bd)[-1]), ((small_len,), bd, contexts(bd)[0])]
        ft_totals = _geometric(max(2, ft_cap // 16), ft_cap, max(3, points // 2 + 1))
        sample_lens = sorted({max(2, min(64, ft_cap)), max(2, min(512, ft_cap))})
        for prefill, bd, ctx in bases:
            room = max_prefill_tokens - sum(prefill)
            add(mode, "finetune", prefill, bd, ctx)  # the 0-token end of the 0..S sweep
            for total in ft_totals:
                total = min(total, room)
                for sample_len in sample_lens:
                    ft = _ft_samples(total, sample_len)
                    if ft:
                        add(mode, "finetune", prefill, bd, ctx, ft)
    # identical shapes (small limits collapse the grids) would only re-weight the fit
    unique: dict[tuple, ProfileShape] = {}
    for shape in shapes:
        unique.setdefault((shape.prefill_lengths, shape.num_decode, shape.decode_context,
                           shape.finetune_lengths, shape.mode), shape)
    return list(unique.values())


# ------------------------------------------------------------------------------------------ the profile


@dataclass(frozen=True, slots=True)
class ProfileKey:
    """What a calibration profile is valid for: a profile is reused only on an exact match."""

    host: str
    engine_version: str
    model: str
    device: str
    dtype: str
    variant: str = ""  # HostCapabilities.timing_variant

    @classmethod
    def for_host(cls, host: HostHooks) -> ProfileKey:
        """The key of a live host (``HostHooks``): its registry name, capabilities and served model."""
        caps = host.capabilities()
        spec = host.model_spec()
        return cls(host=str(host.name), engine_version=str(caps.engine_version), model=str(spec.path),
                   device=str(caps.device), dtype=str(spec.dtype), variant=str(caps.timing_variant))

    def file_name(self) -> str:
        """A filesystem-safe, collision-free name: readable parts plus a hash of the exact key."""
        exact = dataclasses.asdict(self)
        if not self.variant:
            del exact["variant"]  # profiles stored before variants existed keep their names
        digest = hashlib.sha256(json.dumps(exact, sort_keys=True).encode()).hexdigest()[:16]
        parts = (self.host, Path(self.model).name or self.model, self.device, self.dtype) + \
            ((self.variant,) if self.variant else ())
        readable = "-".join(re.sub(r"[^A-Za-z0-9._]+", "_", part)[-40:].strip("_") or "x" for part in parts)
        return f"{readable}-{digest}.json"


def _record_to_dict(r: StepRecord) -> dict[str, Any]:
    return {"mode": r.mode.value, "duration_s": r.duration_s, "prefill_lengths": list(r.prefill_lengths),
            "num_decode": r.num_decode, "kv_tokens": r.kv_tokens, "finetune_lengths": list(r.finetune_lengths)}


def _record_from_dict(i: int, d: dict[str, Any]) -> StepRecord:
    return StepRecord(step_id=i, start_time=0.0, duration_s=float(d["duration_s"]), mode=ExecutionMode(d["mode"]),
                      prefill_lengths=tuple(int(x) for x in d["prefill_lengths"]), num_decode=int(d["num_decode"]),
                      kv_tokens=int(d["kv_tokens"]), finetune_lengths=tuple(int(x) for x in d["finetune_lengths"]),
                      synthetic=True)


@dataclass
class CalibrationProfile:
    """A calibrated latency model with the records it was fitted on (kept as the model's refit anchors).

    ``quality``: in-sample fit quality per mode; ``skipped``: records the fit could not use (aborted or
    non-positive durations); ``elapsed_s``: wall time of the sweep.
    """

    key: ProfileKey
    model: LatencyModel
    records: tuple[StepRecord, ...]
    quality: dict[ExecutionMode, FitQuality]
    created_at: float = field(default_factory=time.time)
    skipped: int = 0
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PROFILE_FORMAT,
            "version": _PROFILE_VERSION,
            "key": dataclasses.asdict(self.key),
            "created_at": self.created_at,
            "elapsed_s": self.elapsed_s,
            "skipped": self.skipped,
            "quality": {m.value: q.to_dict() for m, q in self.quality.items()},
            "model": self.model.to_dict(),
            "records": [_record_to_dict(r) for r in self.records],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationProfile:
        if data.get("format") != PROFILE_FORMAT:
            raise ValueError(f"not a DeltaServe calibration profile (format {data.get('format')!r})")
        if data.get("version") != _PROFILE_VERSION:
            raise ValueError(f"calibration profile version {data.get('version')!r} is not supported (expected "
                             f"{_PROFILE_VERSION}); recalibrate with `deltaserve calibrate`")
        records = tuple(_record_from_dict(i, d) for i, d in enumerate(data["records"]))
        model = LatencyModel.from_dict(data["model"])
        model.set_anchors(records)
        return cls(key=ProfileKey(**data["key"]), model=model, records=records,
                   quality={ExecutionMode(m): FitQuality.from_dict(q) for m, q in data["quality"].items()},
                   created_at=float(data["created_at"]), skipped=int(data.get("skipped", 0)),
                   elapsed_s=float(data.get("elapsed_s", 0.0)))


# ------------------------------------------------------------------------------------------- calibrate


def calibrate(
    host: HostHooks,
    sweep: Sequence[ProfileShape],
    progress: bool = True,
    *,
    warmup: int = 2,
    warm_each_shape: bool = True,
    model: LatencyModel | None = None,
    key: ProfileKey | None = None,
) -> CalibrationProfile:
    """Run every shape of ``sweep`` through ``host.run_profile_step`` and fit a :class:`LatencyModel`.

    Called before the host accepts requests (it executes synthetic steps). Each shape runs
    ``shape.repeats`` times, one record per run; the first shape of each mode first runs ``warmup`` times
    unrecorded (first steps pay for allocator growth and kernel selection), and with ``warm_each_shape`` every
    shape runs once unrecorded before its timed runs: on a GPU the first step of a new shape pays for kernel
    selection and allocator growth (without it the fit prices steps above their steady state, see
    ``docs/benchmarks.md``), and serving runs in steady state. ``model`` supplies the fitting
    configuration (a fresh default one otherwise); ``key`` defaults to :meth:`ProfileKey.for_host`.
    Raises :class:`CalibrationError` naming the host and shape when a step fails, or when the fit leaves a
    mode of the host without coefficients.
    """
    name = getattr(host, "name", type(host).__name__)
    if not sweep:
        raise CalibrationError(f"host {name!r}: the calibration sweep is empty; build it with build_sweep()")
    if key is None:
        key = ProfileKey.for_host(host)
    model = model if model is not None else LatencyModel()

    def run(shape: ProfileShape, index: int) -> StepRecord:
        try:
            record = host.run_profile_step(shape)
        except Exception as exc:  # the host's error is the cause; say which shape provoked it
            raise CalibrationError(f"host {name!r}: profiling step {index} failed for shape "
                                   f"{_describe(shape)}: {exc}") from exc
        if not isinstance(record, StepRecord):
            raise CalibrationError(f"host {name!r}: run_profile_step returned {type(record).__name__}, "
                                   "it must return a StepRecord")
        return record

    started = time.perf_counter()
    warmed: set[ExecutionMode] = set()
    records: list[StepRecord] = []
    total = sum(max(1, s.repeats) for s in sweep)
    bar = _progress_bar(total, f"calibrating {name}", progress)
    try:
        for index, shape in enumerate(sweep):
            if shape.mode not in warmed:
                warmed.add(shape.mode)
                for _ in range(warmup):
                    run(shape, index)
            if warm_each_shape:
                run(shape, index)
            for _ in range(max(1, shape.repeats)):
                records.append(run(shape, index))
                bar.update(1)
    finally:
        bar.close()
    elapsed = time.perf_counter() - started

    skipped_before = model.skipped_records
    quality = model.fit(records, anchor=True)
    skipped = model.skipped_records - skipped_before
    modes = {s.mode for s in sweep}
    missing = [f"{m.value}/{e.value}" for m in sorted(modes, key=lambda m: m.value) for e in Equation
               if model.source(m, e) == "missing"]
    if missing:
        raise CalibrationError(f"host {name!r}: calibration left {', '.join(missing)} without coefficients "
                               f"({len(records)} records, {skipped} unusable); check that run_profile_step "
                               "reports positive device-complete durations")
    return CalibrationProfile(key=key, model=model, records=tuple(records), quality=quality, skipped=skipped,
                              elapsed_s=elapsed)


def _describe(shape: ProfileShape) -> str:
    return (f"(mode={shape.mode.value}, prefill={list(shape.prefill_lengths)}, decode={shape.num_decode}"
            f"x{shape.decode_context}, finetune={list(shape.finetune_lengths)})")


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step")


def format_quality(profile: CalibrationProfile) -> str:
    """A per-mode, per-equation fit-quality table for ``deltaserve calibrate`` to print."""
    lines = [f"calibration of {profile.key.host} ({profile.key.engine_version}) / {profile.key.model} on "
             f"{profile.key.device} ({profile.key.dtype}): {len(profile.records)} steps in "
             f"{profile.elapsed_s:.1f}s, {profile.skipped} unusable",
             f"{'mode':<6} {'equation':<8} {'n':>5} {'MAPE':>7} {'p95':>7} {'max':>7} {'outliers':>8}  source"]
    for mode in ExecutionMode:
        for equation in Equation:
            q = profile.model.equation_quality(mode, equation)
            source = profile.model.source(mode, equation)
            if q is None:
                lines.append(f"{mode.value:<6} {equation.value:<8} {'-':>5} {'-':>7} {'-':>7} {'-':>7} {'-':>8}  "
                             f"{source}")
            else:
                lines.append(f"{mode.value:<6} {equation.value:<8} {q.n:>5} {_pct(q.mape):>7} {_pct(q.p95_ape):>7} "
                             f"{_pct(q.max_ape):>7} {q.dropped:>8}  {source}")
    return "\n".join(lines)


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.2f}%"


# ---------------------------------------------------------------------------------------------- storage


def default_profile_dir() -> Path:
    """``$DELTASERVE_PROFILE_DIR``, else ``$XDG_CACHE_HOME/deltaserve/profiles``, else ``~/.cache/...``."""
    explicit = os.environ.get("DELTASERVE_PROFILE_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "deltaserve" / "profiles"


class ProfileStore:
    """Calibration profiles as JSON files, one per :class:`ProfileKey`, under ``root``.

    Writes are atomic (temporary file in the same directory, fsync, rename), so a crash mid-save never
    leaves a truncated profile that a later start would trust. A file that cannot be read back (corrupt,
    another format version, a different key) is reported with a warning and treated as absent, so the
    caller recalibrates instead of failing.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else default_profile_dir()

    def path_for(self, key: ProfileKey) -> Path:
        return self.root / key.file_name()

    def save(self, profile: CalibrationProfile) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.path_for(profile.key)
        payload = json.dumps(profile.to_dict(), indent=1, allow_nan=False)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=self.root)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        try:  # make the rename itself durable; not possible on every platform/filesystem
            dir_fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError:
            pass
        return target

    def load(self, key: ProfileKey) -> CalibrationProfile | None:
        path = self.path_for(key)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            warnings.warn(f"calibration profile {path} cannot be read ({exc}); recalibrating", RuntimeWarning,
                          stacklevel=2)
            return None
        try:
            profile = CalibrationProfile.from_dict(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            warnings.warn(f"calibration profile {path} is unusable ({exc}); recalibrating", RuntimeWarning,
                          stacklevel=2)
            return None
        if profile.key != key:
            warnings.warn(f"calibration profile {path} belongs to {profile.key}, not {key}; recalibrating",
                          RuntimeWarning, stacklevel=2)
            return None
        return profile

    def delete(self, key: ProfileKey) -> bool:
        try:
            self.path_for(key).unlink()
            return True
        except FileNotFoundError:
            return False

    def keys(self) -> list[ProfileKey]:
        """Keys of the readable profiles in the store."""
        out = []
        for path in sorted(self.root.glob("*.json")):
            try:
                out.append(ProfileKey(**json.loads(path.read_text(encoding="utf-8"))["key"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out


def load_or_calibrate(
    host: HostHooks,
    store: ProfileStore | None = None,
    *,
    force: bool = False,
    progress: bool = True,
    max_prefill_tokens: int = 2048,
    max_decode_batch: int = 64,
    max_kv: int = 65536,
    max_ft_tokens: int | None = None,
    sweep: Iterable[ProfileShape] | None = None,
) -> CalibrationProfile:
    """The stored profile for ``host`` when one matches its :class:`ProfileKey` (unless ``force``), else a
    fresh calibration, saved. ``max_ft_tokens`` defaults to the host's ``max_finetune_tokens_per_step``;
    an explicit ``sweep`` replaces :func:`build_sweep`. Called by the CLI and by job start-up."""
    store = store if store is not None else ProfileStore()
    key = ProfileKey.for_host(host)
    if not force:
        stored = store.load(key)
        if stored is not None:
            return stored
    caps = host.capabilities()
    shapes = list(sweep) if sweep is not None else build_sweep(
        caps, max_prefill_tokens, max_decode_batch, max_kv,
        caps.max_finetune_tokens_per_step if max_ft_tokens is None else max_ft_tokens)
    profile = calibrate(host, shapes, progress, key=key)
    store.save(profile)
    return profile


def install_calibration_adapter(host: HostHooks, lora: LoraConfigSpec | None = None, seed: int = 0) -> None:
    """Load a freshly initialised fine-tuning adapter on ``host`` so calibration can profile fine-tuning rows.

    Calibration outside a job (``deltaserve calibrate``, the benchmarks) has no trained adapter yet, and engines
    such as vLLM run fine-tuning rows only on a loaded adapter. PEFT's initialisation (A random, B zero) costs what
    a trained adapter of the same rank and targets costs, which is all calibration measures. A job calibrates after
    loading its own adapter instead (:class:`~deltaserve_core.coserve.CoServer`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from .adapter_state import fresh_lora_state

    spec = host.model_spec()
    base = AutoModelForCausalLM.from_pretrained(spec.path, dtype=torch.float32)
    host.set_finetune_adapter(fresh_lora_state(base, lora or LoraConfigSpec(), name="deltaserve-calibration",
                                               seed=seed, base_model_path=spec.path))
