"""Held-out accuracy of the calibrated latency model (Equations I and II), next to the timing noise floor.

Usage::

    python benchmarks/latency_model.py [--host reference] [--model tiny|smollm2|DIR] [--device cpu|cuda]
                                       [--json PATH] [--heldout N] [--seed S] [--reuse] [--repeats K]
                                       [--noise-shapes M] [--noise-repeats R]
                                       [--max-prefill T] [--max-decode B] [--max-kv K] [--max-ft F]

What it does, in order (one process, one host):

1. **Calibrate** the host with :func:`~deltaserve_core.calibration.build_sweep` +
   :func:`~deltaserve_core.calibration.calibrate`, exactly as ``deltaserve calibrate`` does, but fresh and not
   saved (``--reuse`` loads/saves through the profile store instead, like job start-up).
2. **Draw a held-out set** of ``N`` random steps from a seeded RNG, independently of the sweep (no held-out shape
   equals a sweep shape), within the calibrated limits, spread evenly over the families each mode of the host
   has: ``prefill`` (1-8 prompts of random lengths), ``decode`` (random batch and per-request context),
   ``mixed`` (prompts plus decodes; hosts with mixed batches), ``finetune`` (eager only: fine-tuning samples of
   random lengths on top of no inference, prompts, decodes or both).
3. **Time** every held-out step ``K`` times (``--repeats``, default 3) and ``M`` of them per mode (``--noise-shapes``,
   chosen to span the families and sizes) ``R`` times (``--noise-repeats``, default 5·K). Before timing, every shape
   runs once untimed (warm-up: allocator growth, first-call dispatch). Timed runs are **interleaved**: in each round
   every shape that still needs a timing runs once, in a freshly shuffled order, so drift and other tenants' load
   hit all shapes alike instead of biasing whichever ran during a busy minute.
4. **Report**, per execution mode the steps ran in:

   * ``heldout``: MAPE, p95 and max of ``|predicted − measured| / measured`` where *measured* is the **median of the
     K timings** of that step (``single_run`` repeats the numbers with only the first timing, for comparison);
     a per-family breakdown with the signed mean error (bias) shows where the error comes from;
   * ``noise_floor``: for the M noise shapes, ``|t − m| / m`` with ``m`` the median of that shape's R timings --
     ``single_run`` over every timing, ``median_of_k`` over the medians of consecutive groups of K timings. The
     ``median_of_k`` mean is what a *perfect* model would score as held-out MAPE against these measurements, so
     it is the number the held-out MAPE is compared with (``ratio`` = MAPE / that floor;
     ``within_noise_floor`` = ratio ≤ 1);
   * ``interleaved_fit``: the same model (:meth:`LatencyModel.fit`, trimmed NNLS) refitted on the sweep's shapes
     *timed inside the same interleaved rounds* (median of K each; ``--no-interleaved-fit`` skips this). On a
     shared machine the load drifts between the calibration phase and the held-out phase, which biases every
     prediction one way; this refit has no such drift and no single-run calibration noise, so its held-out error
     is the equations' own, and the gap between the two numbers is what calibrating once costs here (online
     refit exists for exactly that drift);
   * ``diagnostics.candidate_features``: the production equations refitted next to variants -- for Equation I
     ``paper_eq1`` (the paper's, without the per-row term δ·R that the production ``eq1`` has: R = prompts +
     fine-tuning samples + decodes, a per-request cost such as the reference host's attention loop over
     requests; this pair is what justified adding δ), ``eq1_rows_only`` (δ·R but without the co-serving terms
     ζ·U + η of steps carrying fine-tuning rows; this pair is what justified those), and ``eq1+sampling`` (1 when the step samples a token:
     the LM head's weights are read once per such step, and fine-tuning-only steps skip it); for Equation II,
     ``eq2+ctx_sq`` (Σ contextᵢ²) -- all fitted the same way (relative-error NNLS, no outlier trimming) on the
     interleaved sweep timings (the calibration records with ``--no-interleaved-fit``) and scored on the held-out
     steps. They say which term explains the excess over the noise floor; the production model is not changed
     by them.

Writes JSON (default ``benchmarks/results/latency_model_<host>_<model>.json``) with the machine (CPU count,
torch version, load averages before and after each phase, date), the command line, the configuration, the
calibration's in-sample quality and coefficients, the numbers above and every held-out point.

Limits default to a CPU-sized sweep (1024 prompt tokens per step, decode batches up to 32, 16k KV tokens);
on a GPU pass the serving limits (e.g. ``--max-prefill 8192 --max-decode 256 --max-kv 262144``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: a 2-core machine crawls otherwise

import argparse
import dataclasses
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, command_line, load_average, machine_info, write_json  # noqa: E402

from deltaserve_core.calibration import (  # noqa: E402
    ProfileStore,
    build_sweep,
    calibrate,
    install_calibration_adapter,
    load_or_calibrate,
)
from deltaserve_core.assets import MODEL_SHORTCUTS, resolve_model  # noqa: E402
from deltaserve_core.calibration_cli import check_device  # noqa: E402
from deltaserve_core.latency_model import (  # noqa: E402
    Equation,
    LatencyModel,
    _nnls_relative,
    prefill_features,
)
from deltaserve_core.types import ExecutionMode, HostCapabilities, ProfileShape, StepRecord  # noqa: E402

# ------------------------------------------------------------------------------------------ held-out draws


@dataclass(frozen=True)
class Limits:
    """The calibrated range; held-out steps stay inside it (the model interpolates, it is not asked to extrapolate)."""

    max_prefill: int
    max_decode: int
    max_kv: int
    max_ft: int


def _log_int(rng: random.Random, lo: int, hi: int) -> int:
    """An integer log-uniformly distributed on [lo, hi]: short and long steps are equally represented."""
    if hi <= lo:
        return lo
    return min(hi, max(lo, round(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))) - 0.5)))


def _random_split(rng: random.Random, total: int, parts: int, minimum: int = 1) -> tuple[int, ...]:
    """``total`` split into ``parts`` random positive lengths (each ≥ ``minimum``), unlike the sweep's even splits."""
    parts = max(1, min(parts, total // minimum))
    weights = [rng.random() + 0.1 for _ in range(parts)]
    spare = total - minimum * parts
    lengths = [minimum + int(spare * w / sum(weights)) for w in weights]
    lengths[rng.randrange(parts)] += total - sum(lengths)
    return tuple(lengths)


def _prompts(rng: random.Random, budget: int, max_requests: int = 8) -> tuple[int, ...]:
    requests = _log_int(rng, 1, max_requests)
    total = _log_int(rng, min(budget, 8 * requests), budget)
    return _random_split(rng, total, requests)


def _decodes(rng: random.Random, limits: Limits) -> tuple[int, int]:
    bd = _log_int(rng, 1, limits.max_decode)
    top = max(1, limits.max_kv // bd)
    return bd, _log_int(rng, min(16, top), top)


def _finetune(rng: random.Random, budget: int) -> tuple[int, ...]:
    total = _log_int(rng, 2, budget)
    lengths: list[int] = []
    while total - sum(lengths) >= 2:
        left = total - sum(lengths)
        n = _log_int(rng, 2, min(512, left))
        if left - n == 1:
            n += 1  # a 1-token remainder is not a sample (a sample needs a prompt and a target token)
        lengths.append(n)
    return tuple(lengths)


def families_for(caps: HostCapabilities, mode: ExecutionMode, limits: Limits) -> list[str]:
    """The held-out families a mode of this host can run (fine-tuning rows only ever run eagerly)."""
    fams = ["prefill", "decode"]
    if caps.mixed_batches:
        fams.append("mixed")
    if mode is ExecutionMode.EAGER and limits.max_ft >= 2:
        fams.append("finetune")
    return fams


def draw_shape(rng: random.Random, family: str, mode: ExecutionMode, limits: Limits,
               mixed_batches: bool) -> ProfileShape:
    """One random step of ``family``; called by :func:`draw_heldout`."""
    prefill: tuple[int, ...] = ()
    bd = ctx = 0
    ft: tuple[int, ...] = ()
    if family == "prefill":
        prefill = _prompts(rng, limits.max_prefill)
    elif family == "decode":
        bd, ctx = _decodes(rng, limits)
    elif family == "mixed":
        prefill = _prompts(rng, max(2, limits.max_prefill // 2), max_requests=4)
        bd, ctx = _decodes(rng, limits)
    elif family == "finetune":
        base = rng.choice(["none", "prefill", "decode", "both"] if mixed_batches else ["none", "prefill"])
        room = min(limits.max_ft, limits.max_prefill)
        if base in ("prefill", "both"):
            prefill = _prompts(rng, max(2, limits.max_prefill // 2), max_requests=4)
            room = min(limits.max_ft, limits.max_prefill - sum(prefill))
        if base in ("decode", "both"):
            bd, ctx = _decodes(rng, limits)
        ft = _finetune(rng, max(2, room))
    else:
        raise ValueError(f"unknown held-out family {family!r}")
    return ProfileShape(prefill_lengths=prefill, num_decode=bd, decode_context=ctx if bd else 0,
                        finetune_lengths=ft, mode=mode, tags=("heldout", family))


def _shape_key(s: ProfileShape) -> tuple:
    return (s.prefill_lengths, s.num_decode, s.decode_context, s.finetune_lengths, s.mode)


def draw_heldout(caps: HostCapabilities, limits: Limits, n: int, rng: random.Random,
                 exclude: Sequence[ProfileShape] = ()) -> list[tuple[str, ProfileShape]]:
    """``n`` (family, shape) pairs over every mode of the host, families round-robin, none equal to ``exclude``."""
    modes = sorted(caps.graph_modes, key=lambda m: m.value)
    slots = [(mode, fam) for mode in modes for fam in families_for(caps, mode, limits)]
    seen = {_shape_key(s) for s in exclude}
    out: list[tuple[str, ProfileShape]] = []
    i = 0
    while len(out) < n:
        mode, fam = slots[i % len(slots)]
        i += 1
        for _ in range(100):
            shape = draw_shape(rng, fam, mode, limits, caps.mixed_batches)
            if _shape_key(shape) not in seen:
                break
        seen.add(_shape_key(shape))
        out.append((fam, shape))
    return out


# -------------------------------------------------------------------------------------------------- timing


@dataclass
class Point:
    """One held-out step: its shape, every timing (chronological) and the first record the host returned."""

    family: str
    shape: ProfileShape
    wanted: int  # how many timings this point needs (K, or R for a noise shape)
    noise: bool = False
    timings: list[float] = field(default_factory=list)
    record: StepRecord | None = None


def pick_noise_shapes(points: list[Point], per_mode: int, rng: random.Random) -> None:
    """Mark ``per_mode`` points per mode as noise shapes: round-robin over families, spread over step sizes."""
    by_mode: dict[ExecutionMode, dict[str, list[Point]]] = {}
    for p in points:
        by_mode.setdefault(p.shape.mode, {}).setdefault(p.family, []).append(p)
    for fams in by_mode.values():
        for group in fams.values():  # ascending size, so taking evenly spaced ranks spans short to long steps
            group.sort(key=lambda p: sum(p.shape.prefill_lengths) + sum(p.shape.finetune_lengths)
                       + p.shape.num_decode * (1 + p.shape.decode_context // 64))
        order = sorted(fams)
        quota = {f: 0 for f in order}
        for i in range(per_mode):
            quota[order[i % len(order)]] += 1
        for fam, q in quota.items():
            group = fams[fam]
            q = min(q, len(group))
            for j in range(q):
                group[int((j + 0.5) * len(group) / q)].noise = True


def run_timings(host: Any, points: list[Point], rng: random.Random, warmup_passes: int, progress: bool) -> None:
    """Warm up, then time every point ``wanted`` times in interleaved, reshuffled rounds (see the module docs)."""
    from tqdm.auto import tqdm

    total = sum(p.wanted for p in points) + warmup_passes * len(points)
    bar = tqdm(total=total, desc="held-out timing", unit="step", disable=not progress)
    try:
        for _ in range(warmup_passes):
            order = list(range(len(points)))
            rng.shuffle(order)
            for i in order:
                host.run_profile_step(points[i].shape)
                bar.update(1)
        for rnd in range(max(p.wanted for p in points)):
            order = [i for i, p in enumerate(points) if rnd < p.wanted]
            rng.shuffle(order)
            for i in order:
                record = host.run_profile_step(points[i].shape)
                points[i].timings.append(record.duration_s)
                if points[i].record is None:
                    points[i].record = record
                bar.update(1)
    finally:
        bar.close()


# -------------------------------------------------------------------------------------------------- scoring


def _stats(values: Sequence[float]) -> dict[str, Any]:
    """n, mean, median, p95 and max of absolute (fractional) errors."""
    if not values:
        return {"n": 0, "mean": None, "median": None, "p95": None, "max": None}
    ordered = sorted(values)
    p95 = float(statistics.quantiles(ordered, n=20, method="inclusive")[-1]) if len(ordered) > 1 else ordered[0]
    return {"n": len(ordered), "mean": statistics.fmean(ordered), "median": statistics.median(ordered),
            "p95": p95, "max": ordered[-1]}


def predict(model: LatencyModel, record: StepRecord) -> float:
    return model.predict(record.prefill_lengths, record.num_decode, record.kv_tokens, record.finetune_lengths,
                         record.mode)


def measured(point: Point, k: int) -> float:
    """The held-out measurement of a point: the median of its first ``k`` timings."""
    return statistics.median(point.timings[:k])


def score_heldout(model: LatencyModel, points: list[Point], k: int) -> dict[str, Any]:
    """Per-mode held-out error (median-of-k and single-run), with a per-family breakdown."""
    out: dict[str, Any] = {}
    modes = sorted({p.record.mode for p in points if p.record is not None}, key=lambda m: m.value)
    for mode in modes:
        mine = [p for p in points if p.record is not None and p.record.mode is mode]
        ape, ape1, fams = [], [], {}
        for p in mine:
            pred = predict(model, p.record)  # type: ignore[arg-type]
            y = measured(p, k)
            ape.append(abs(pred - y) / y)
            ape1.append(abs(pred - p.timings[0]) / p.timings[0])
            fams.setdefault(p.family, []).append((pred - y) / y)
        q = _stats(ape)
        out[mode.value] = {
            "n": q["n"], "mape": q["mean"], "p95_ape": q["p95"], "max_ape": q["max"], "median_ape": q["median"],
            "single_run": {"mape": _stats(ape1)["mean"], "p95_ape": _stats(ape1)["p95"]},
            "per_family": {
                fam: {"n": len(errs), "mape": statistics.fmean(map(abs, errs)),
                      "p95_ape": _stats([abs(e) for e in errs])["p95"], "bias": statistics.fmean(errs)}
                for fam, errs in sorted(fams.items())
            },
        }
    return out


def noise_floor(points: list[Point], k: int) -> dict[str, Any]:
    """Spread of repeated timings of the same step, per mode (see the module docs for the two variants)."""
    out: dict[str, Any] = {}
    for mode in sorted({p.shape.mode for p in points if p.noise}, key=lambda m: m.value):
        single, grouped, shapes = [], [], []
        for p in points:
            if not p.noise or p.shape.mode is not mode:
                continue
            m = statistics.median(p.timings)
            devs = [abs(t - m) / m for t in p.timings]
            groups = [statistics.median(p.timings[i:i + k]) for i in range(0, len(p.timings) - k + 1, k)]
            gdevs = [abs(g - m) / m for g in groups]
            single += devs
            grouped += gdevs
            shapes.append({"family": p.family, "shape": _shape_dict(p.shape), "median_s": m,
                           "min_s": min(p.timings), "max_s": max(p.timings),
                           "mean_abs_dev": statistics.fmean(devs), "timings_s": p.timings})
        s1, sk = _stats(single), _stats(grouped)
        out[mode.value] = {
            "single_run": {"mean_abs_pct_dev": s1["mean"], "median_abs_pct_dev": s1["median"], "p95": s1["p95"],
                           "n": s1["n"]},
            "median_of_k": {"k": k, "mean_abs_pct_dev": sk["mean"], "median_abs_pct_dev": sk["median"],
                            "p95": sk["p95"], "n": sk["n"]},
            "shapes": shapes,
        }
    return out


# ------------------------------------------------------------------------------ diagnostics: candidate features
#
# Each candidate is an equation plus or minus features of the host's work. Equation I's base here is the paper's
# (``paper_eq1``); the production Equation I is ``eq1`` = paper + ``rows`` (δ·R) + the co-serving terms. All variants are refitted here
# the same way (the latency model's relative-error NNLS, no outlier trimming) on the calibration records and
# scored on the held-out steps, so a difference between two variants is the feature's doing. The production
# model is not changed by any of this.


def _rows(record: StepRecord) -> float:
    """Rows with their own attention call: prompts, fine-tuning samples and decodes (the reference host loops)."""
    return float(len(record.prefill_lengths) + len(record.finetune_lengths) + record.num_decode)


def _sampling(record: StepRecord) -> float:
    """1 when the step samples a token (any inference row): the LM head's weights are read once per such step."""
    return 1.0 if record.prefill_lengths or record.num_decode else 0.0


def _ctx_sq(record: StepRecord) -> float:
    """Σ contextᵢ² of the decode rows; held-out and sweep decodes share one context, so it is K² / B_d."""
    return record.kv_tokens * record.kv_tokens / record.num_decode if record.num_decode else 0.0


def _coserve_tokens(record: StepRecord) -> float:
    """U of Equation I's co-serving term ζ·U: inference tokens of a step that carries fine-tuning rows."""
    return float(sum(record.prefill_lengths) + record.num_decode) if record.finetune_lengths else 0.0


def _coserve_step(record: StepRecord) -> float:
    return 1.0 if record.finetune_lengths else 0.0


_EXTRA = {"rows": _rows, "sampling": _sampling, "ctx_sq": _ctx_sq, "coserve_tokens": _coserve_tokens,
          "coserve_step": _coserve_step}
_VARIANTS: dict[Equation, dict[str, tuple[str, ...]]] = {
    Equation.PREFILL: {"paper_eq1": (), "eq1_rows_only": ("rows",), "paper_eq1+sampling": ("sampling",),
                       "eq1": ("rows", "coserve_tokens", "coserve_step"),
                       "eq1+sampling": ("rows", "coserve_tokens", "coserve_step", "sampling")},
    Equation.DECODE: {"eq2": (), "eq2+ctx_sq": ("ctx_sq",)},
}
_BASE_NAMES = {Equation.PREFILL: ("alpha", "beta", "gamma", "eps", "c"), Equation.DECODE: ("beta", "eps", "c")}
# the production model's names for its extra coefficients
_EXTRA_NAMES = {"rows": "delta", "coserve_tokens": "zeta", "coserve_step": "eta"}


def _features(record: StepRecord, equation: Equation, extra: tuple[str, ...]) -> list[float]:
    if equation is Equation.PREFILL:
        s, t, f, kv, _ = prefill_features(record.prefill_lengths, record.num_decode, record.kv_tokens,
                                          record.finetune_lengths)
        row = [float(s), float(t), float(f), float(kv), 1.0]  # the paper's features; R comes as extra "rows"
    else:
        row = [float(record.num_decode), float(record.kv_tokens), 1.0]
    return row + [_EXTRA[name](record) for name in extra]


def feature_diagnostic(records: Sequence[StepRecord], points: list[Point], k: int) -> dict[str, Any]:
    """Per mode and equation: each candidate variant's coefficients and held-out MAPE / p95 (overall, per family)."""
    out: dict[str, Any] = {}
    usable = [r for r in records if r.duration_s > 0 and not r.aborted_sample_ids]
    for mode in sorted({r.mode for r in usable}, key=lambda m: m.value):
        for equation in Equation:
            def of_eq(r: StepRecord) -> bool:
                return r.has_prefill if equation is Equation.PREFILL else not r.has_prefill

            train = [r for r in usable if r.mode is mode and of_eq(r)]
            test = [p for p in points if p.record is not None and p.record.mode is mode and of_eq(p.record)]
            if len(train) < 8 or not test:
                continue
            entry: dict[str, Any] = {"train_steps": len(train), "heldout_steps": len(test), "variants": {}}
            for name, extra in _VARIANTS[equation].items():
                coef = _nnls_relative([(*_features(r, equation, extra), r.duration_s) for r in train])
                errs: dict[str, list[float]] = {}
                for p in test:
                    row = _features(p.record, equation, extra)  # type: ignore[arg-type]
                    pred = sum(c * v for c, v in zip(coef, row))
                    y = measured(p, k)
                    errs.setdefault(p.family, []).append(abs(pred - y) / y)
                q = _stats([e for v in errs.values() for e in v])
                entry["variants"][name] = {
                    "coefficients": dict(zip(_BASE_NAMES[equation] + tuple(_EXTRA_NAMES.get(x, x) for x in extra),
                                             coef)),
                    "mape": q["mean"], "p95_ape": q["p95"],
                    "per_family_mape": {f: statistics.fmean(v) for f, v in sorted(errs.items())},
                }
            out.setdefault(mode.value, {})[equation.value] = entry
    return out


# ------------------------------------------------------------------------------------------------- the run


def _shape_dict(s: ProfileShape) -> dict[str, Any]:
    return {"prefill_lengths": list(s.prefill_lengths), "num_decode": s.num_decode,
            "decode_context": s.decode_context, "finetune_lengths": list(s.finetune_lengths), "mode": s.mode.value}


def _model_label(model: str, path: Path) -> str:
    return model if model in MODEL_SHORTCUTS else path.name


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="reference", help="registered host name")
    ap.add_argument("--model", default="tiny", help="tiny, smollm2, or a checkpoint folder")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--json", type=Path, default=None,
                    help="output (default benchmarks/results/latency_model_<host>_<model>.json)")
    ap.add_argument("--heldout", type=int, default=60, help="held-out steps, over all modes and families")
    ap.add_argument("--seed", type=int, default=0, help="seed of the held-out draw and of the timing order")
    ap.add_argument("--repeats", type=int, default=3, metavar="K", help="timings per held-out step (median taken)")
    ap.add_argument("--noise-shapes", type=int, default=8, metavar="M", help="noise-floor shapes per mode")
    ap.add_argument("--noise-repeats", type=int, default=None, metavar="R", help="timings per noise shape (5·K)")
    ap.add_argument("--warmup-passes", type=int, default=1, help="untimed passes over every shape before timing")
    ap.add_argument("--sweep-repeats", type=int, default=1, help="runs of each calibration shape")
    ap.add_argument("--reuse", action="store_true", help="use (and save) a stored calibration profile")
    ap.add_argument("--no-interleaved-fit", action="store_true",
                    help="skip re-timing the sweep inside the held-out rounds (faster; no drift-free refit)")
    ap.add_argument("--store", type=Path, default=None, help="profile store for --reuse")
    ap.add_argument("--max-prefill", type=int, default=1024)
    ap.add_argument("--max-decode", type=int, default=32)
    ap.add_argument("--max-kv", type=int, default=16384)
    ap.add_argument("--max-ft", type=int, default=None, help="default: the host's limit, capped by --max-prefill")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="host option (repeatable), e.g. async_scheduling=false for vLLM")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.noise_repeats is None:
        args.noise_repeats = 5 * args.repeats
    for name in ("heldout", "repeats", "noise_repeats", "max_prefill", "max_decode", "max_kv", "sweep_repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.noise_repeats < 2 * args.repeats:
        ap.error("--noise-repeats must be at least 2 x --repeats (the median-of-K floor needs two groups)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from deltaserve_core.driver import HostConfig
    from deltaserve_core.registry import create_host

    check_device(args.device)
    model_path = resolve_model(args.model)
    from transformers import AutoConfig

    # Engines refuse a sequence longer than the model's context: keep every swept and held-out shape inside it.
    max_pos = int(getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", 1 << 30))
    if args.max_prefill >= max_pos or args.max_kv >= max_pos:
        args.max_prefill = min(args.max_prefill, max_pos // 2)
        args.max_kv = min(args.max_kv, max_pos - 64)
        print(f"limits capped to the model's {max_pos}-token context: --max-prefill {args.max_prefill} "
              f"--max-kv {args.max_kv}")
    label = _model_label(args.model, model_path)
    out_path = args.json or RESULTS / f"latency_model_{args.host}_{label}.json"
    loads: dict[str, Any] = {"start": load_average()}
    info = machine_info(args.device)

    options = dict(kv.split("=", 1) for kv in args.option)
    host = create_host(args.host, HostConfig(model=str(model_path), device=args.device, dtype=args.dtype,
                                             max_batch_tokens=max(2048, args.max_prefill), seed=args.seed,
                                             options=options))
    try:
        install_calibration_adapter(host)  # fine-tuning rows need a loaded adapter on engines like vLLM
        caps = host.capabilities()
        max_ft = min(caps.max_finetune_tokens_per_step, args.max_prefill,
                     args.max_ft if args.max_ft is not None else caps.max_finetune_tokens_per_step)
        limits = Limits(args.max_prefill, args.max_decode, args.max_kv, max_ft)
        sweep = build_sweep(caps, limits.max_prefill, limits.max_decode, limits.max_kv, limits.max_ft,
                            repeats=args.sweep_repeats)
        started = time.perf_counter()
        if args.reuse:
            profile = load_or_calibrate(host, ProfileStore(args.store), progress=not args.no_progress,
                                        sweep=sweep)
        else:
            profile = calibrate(host, sweep, progress=not args.no_progress)
        calib_wall = time.perf_counter() - started
        loads["after_calibration"] = load_average()

        rng = random.Random(args.seed)
        drawn = draw_heldout(caps, limits, args.heldout, rng, exclude=sweep)
        points = [Point(fam, shape, args.repeats) for fam, shape in drawn]
        pick_noise_shapes(points, args.noise_shapes, rng)
        for p in points:
            if p.noise:
                p.wanted = args.noise_repeats
        # The sweep again, timed in the same interleaved rounds as the held-out steps (see the module docs).
        sweep_points = [] if args.no_interleaved_fit else [Point("sweep", shape, args.repeats) for shape in sweep]
        started = time.perf_counter()
        run_timings(host, points + sweep_points, random.Random(args.seed + 1), args.warmup_passes,
                    not args.no_progress)
        timing_wall = time.perf_counter() - started
        loads["after_timing"] = load_average()
    finally:
        host.shutdown()

    model = profile.model
    heldout = score_heldout(model, points, args.repeats)
    floor = noise_floor(points, args.repeats)
    interleaved: dict[str, Any] | None = None
    diagnostic_records: Sequence[StepRecord] = profile.records
    if sweep_points:
        diagnostic_records = [dataclasses.replace(p.record, duration_s=measured(p, args.repeats))
                              for p in sweep_points if p.record is not None]
        refit = LatencyModel()
        quality = refit.fit(diagnostic_records)
        interleaved = {"in_sample": {m.value: q.to_dict() for m, q in quality.items()},
                       "heldout": score_heldout(refit, points, args.repeats)}
    verdict: dict[str, Any] = {}
    for mode, h in heldout.items():
        f = floor.get(mode, {}).get("median_of_k", {}).get("mean_abs_pct_dev")
        verdict[mode] = {"heldout_mape": h["mape"], "noise_floor_mape": f,
                         "ratio": None if not f else h["mape"] / f,
                         "within_noise_floor": None if f is None else h["mape"] <= f}
        if interleaved is not None and mode in interleaved["heldout"]:
            m2 = interleaved["heldout"][mode]["mape"]
            verdict[mode].update({"interleaved_fit_heldout_mape": m2,
                                  "interleaved_fit_ratio": None if not f else m2 / f,
                                  "interleaved_fit_within_noise_floor": None if f is None else m2 <= f})
    result = {
        "benchmark": "latency_model",
        "command": command_line(argv),
        "machine": info,
        "load_average": loads,
        "config": {
            "host": args.host, "engine": caps.engine, "engine_version": caps.engine_version,
            "model": args.model, "model_path": str(model_path), "device": args.device, "dtype": args.dtype,
            "modes": sorted(m.value for m in caps.graph_modes), "mixed_batches": caps.mixed_batches,
            "limits": dataclasses.asdict(limits), "heldout": args.heldout, "seed": args.seed,
            "repeats_k": args.repeats, "noise_shapes_per_mode": args.noise_shapes,
            "noise_repeats_r": args.noise_repeats, "warmup_passes": args.warmup_passes,
            "sweep_repeats": args.sweep_repeats, "reused_profile": args.reuse,
        },
        "what_is_reported": (
            "heldout.<mode>.mape/p95_ape: |pred - measured| / measured over held-out steps, measured = median of K "
            "interleaved timings; noise_floor.<mode>.median_of_k.mean_abs_pct_dev: mean |median of K timings - "
            "median of R timings| / median of R timings of the same step (what a perfect model would score); "
            "noise_floor.<mode>.single_run: the same for single timings. ratio = heldout MAPE / median_of_k floor."
        ),
        "calibration": {
            "steps": len(profile.records), "sweep_shapes": len(sweep), "elapsed_s": profile.elapsed_s,
            "wall_s": calib_wall,
            "in_sample": {m.value: q.to_dict() for m, q in profile.quality.items()},
            "records": [{"mode": r.mode.value, "duration_s": r.duration_s, "prefill_lengths": list(r.prefill_lengths),
                         "num_decode": r.num_decode, "kv_tokens": r.kv_tokens,
                         "finetune_lengths": list(r.finetune_lengths)} for r in profile.records],
            "coefficients": {
                m.value: {e.value: dataclasses.asdict(c) if (c := model.coefficients(m, e)) is not None else None
                          for e in Equation}
                for m in sorted(caps.graph_modes, key=lambda m: m.value)
            },
        },
        "timing_wall_s": timing_wall,
        "verdict": verdict,
        "heldout": heldout,
        "noise_floor": floor,
        "interleaved_fit": interleaved,
        "diagnostics": {
            "fitted_on": "interleaved sweep (median of K)" if sweep_points else "calibration records",
            "candidate_features": feature_diagnostic(diagnostic_records, points, args.repeats),
        },
        "points": [
            {"family": p.family, "noise_shape": p.noise, **_shape_dict(p.shape),
             "ran_in": p.record.mode.value if p.record else None,
             "measured_s": measured(p, args.repeats), "predicted_s": predict(model, p.record) if p.record else None,
             "timings_s": p.timings}
            for p in points
        ],
    }
    write_json(out_path, result)
    _print_summary(result, out_path)
    return 0


def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:5.2f}%"


def _print_summary(result: dict[str, Any], path: Path) -> None:
    cfg = result["config"]
    print(f"\nlatency model on {cfg['host']} / {cfg['model']} ({cfg['device']}, {cfg['dtype']}); "
          f"held-out = median of {cfg['repeats_k']} interleaved timings")
    print(f"{'mode':<6} {'n':>4} {'MAPE':>7} {'p95':>7} {'1-run MAPE':>10} | {'floor k':>7} {'floor p95':>9} "
          f"{'floor 1-run':>11} | ratio")
    for mode, h in result["heldout"].items():
        f = result["noise_floor"].get(mode, {})
        fk, f1 = f.get("median_of_k", {}), f.get("single_run", {})
        ratio = result["verdict"][mode]["ratio"]
        print(f"{mode:<6} {h['n']:>4} {_pct(h['mape']):>7} {_pct(h['p95_ape']):>7} "
              f"{_pct(h['single_run']['mape']):>10} | {_pct(fk.get('mean_abs_pct_dev')):>7} "
              f"{_pct(fk.get('p95')):>9} {_pct(f1.get('mean_abs_pct_dev')):>11} | "
              f"{'-' if ratio is None else f'{ratio:.2f}'}")
        for fam, s in h["per_family"].items():
            print(f"    {fam:<10} n={s['n']:<3} MAPE {_pct(s['mape'])}  p95 {_pct(s['p95_ape'])}  "
                  f"bias {100 * s['bias']:+.2f}%")
    if result["interleaved_fit"] is not None:
        for mode, h in result["interleaved_fit"]["heldout"].items():
            ratio = result["verdict"][mode].get("interleaved_fit_ratio")
            print(f"{mode}: refit on the sweep timed interleaved with the held-out steps: MAPE {_pct(h['mape'])}, "
                  f"p95 {_pct(h['p95_ape'])}, ratio {'-' if ratio is None else f'{ratio:.2f}'}  ("
                  + ", ".join(f"{fam} {_pct(v['mape']).strip()}" for fam, v in h["per_family"].items()) + ")")
    for mode, eqs in result["diagnostics"]["candidate_features"].items():
        for equation, entry in eqs.items():
            cells = ", ".join(f"{name} {_pct(v['mape']).strip()} (p95 {_pct(v['p95_ape']).strip()})"
                              for name, v in entry["variants"].items())
            print(f"{mode} {equation} refits on held-out: {cells}")
    print(f"-> {path}")


if __name__ == "__main__":
    raise SystemExit(main())
