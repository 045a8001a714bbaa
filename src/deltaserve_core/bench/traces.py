"""Request arrival traces: the paper's burst-light and burst-dense patterns, a production-shaped trace, and replay.

A trace is a list of arrivals (time, prompt tokens, output tokens). Generators build a *rate curve* on a 0.1 s grid
at the paper's reference scale (the four-A100 figures: 80 and 120 req/s peaks) and draw arrivals from it as a
non-homogeneous Poisson process with a seeded generator; lengths come from a :class:`~.lengths.LengthTable`.

Shapes (paper §4.1, Figure 4; the exact curves are not published, so these parameters are ours):

* ``burst-light``: 60 s; every 10 s a 2 s peak at 80 req/s, 8 req/s in between (first peak at 4 s).
* ``burst-dense``: 60 s; every 10 s a 4 s peak at 120 req/s, 12 req/s in between (first peak at 4 s).
* ``production``: 20 min, standing in for the non-public Nutanix trace, see :class:`ProductionShape`: a slowly
  drifting background (log-rate Ornstein-Uhlenbeck), long near-zero stretches (a two-state on/quiet regime),
  Poisson-timed bursts with heavy-tailed heights and lengths, bursts clustered into storms (multi-scale), and at
  least one spike above 100 req/s.

Scaling: ``scale`` multiplies every rate (the paper scales the same patterns down "proportionally ... to match the
capacity of one GPU"); :func:`capacity_scale` derives it from a host's measured capacity. ``time_scale`` < 1
compresses time (a 20-min trace in 2 min keeps its relative structure; bursts get shorter too). ``duration_s``
truncates. Files: :meth:`Trace.save` / :func:`read_trace_file` (CSV or JSONL under the column names public traces
use: Mooncake, Azure LLM inference, or mapped explicitly), validated before any host starts, then windowed and
time-scaled by :func:`window_trace` (:func:`auto_file_factor` maps a window's mean rate to a target).
"""

from __future__ import annotations

import bisect
import csv
import json
import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .lengths import LengthTable

__all__ = [
    "BURST_DENSE",
    "BURST_LIGHT",
    "PRODUCTION",
    "REFERENCE_PEAK_RPS",
    "OUTPUT_COLUMNS",
    "PROMPT_COLUMNS",
    "TIME_COLUMNS",
    "TRACE_NAMES",
    "BurstShape",
    "ProductionShape",
    "Trace",
    "TraceFile",
    "TraceRequest",
    "auto_file_factor",
    "capacity_scale",
    "generate_trace",
    "load_trace",
    "parse_trace_columns",
    "rate_curve",
    "read_trace_file",
    "window_trace",
]

_DT = 0.1  # seconds per rate-grid cell

#: The densest reference peak (burst-dense); capacity scaling maps it to ``load`` x the host's capacity.
REFERENCE_PEAK_RPS = 120.0


@dataclass(frozen=True, slots=True)
class TraceRequest:
    t: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class BurstShape:
    """A periodic square-wave burst pattern (rates in req/s at the reference scale)."""

    duration_s: float = 60.0
    period_s: float = 10.0
    peak_s: float = 2.0
    peak_rps: float = 80.0
    base_rps: float = 8.0
    first_peak_s: float = 4.0


BURST_LIGHT = BurstShape(peak_s=2.0, peak_rps=80.0, base_rps=8.0)
BURST_DENSE = BurstShape(peak_s=4.0, peak_rps=120.0, base_rps=12.0)


@dataclass(frozen=True)
class ProductionShape:
    """Parameters of the production-shaped trace (reference scale). Defaults give a 20-minute trace whose mean is
    ~20 % of its tallest spike, with minute-long near-zero stretches and spikes above 100 req/s.

    - background: ``exp(x)`` req/s with ``x`` an Ornstein-Uhlenbeck process around ``log(base_rps)`` (time
      constant ``drift_tau_s``, stationary std ``drift_sigma``): load that wanders over minutes;
    - quiet regime: alternating on/quiet periods with exponential lengths (means ``on_mean_s``/``quiet_mean_s``);
      while quiet, the background is multiplied by ``quiet_factor`` (near zero) and fewer bursts start;
    - storms: periods (mean ``storm_mean_s`` every ``storm_every_s``) during which bursts start
      ``storm_burst_factor`` times as often: bursts cluster at a second scale;
    - bursts: start as a Poisson process (mean gap ``burst_every_s``); height = ``burst_scale_rps`` x Pareto(
      ``burst_alpha``) capped at ``burst_cap_rps``; length lognormal (median ``burst_median_s``, sigma
      ``burst_sigma``, capped at ``burst_max_s``); 0.5 s rise, plateau, exponential tail of ``burst_decay_s``;
    - ``min_spike_rps``: if no burst reached it, one burst at a random time is raised to it (the paper's trace has
      spikes above 100 req/s; a seed without one would not be that trace).
    """

    duration_s: float = 1200.0
    base_rps: float = 14.0
    drift_tau_s: float = 120.0
    drift_sigma: float = 0.5
    on_mean_s: float = 150.0
    quiet_mean_s: float = 60.0
    quiet_factor: float = 0.03
    storm_every_s: float = 240.0
    storm_mean_s: float = 60.0
    storm_burst_factor: float = 4.0
    burst_every_s: float = 45.0
    burst_scale_rps: float = 25.0
    burst_alpha: float = 1.5
    burst_cap_rps: float = 140.0
    burst_median_s: float = 4.0
    burst_sigma: float = 0.8
    burst_max_s: float = 120.0
    burst_decay_s: float = 1.5
    min_spike_rps: float = 105.0


PRODUCTION = ProductionShape()
TRACE_NAMES = ("burst-light", "burst-dense", "production")


@dataclass(frozen=True)
class Trace:
    """Arrivals sorted by time (seconds from the trace start) plus how they were made (``params``)."""

    name: str
    requests: tuple[TraceRequest, ...]
    duration_s: float
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ts = [r.t for r in self.requests]
        if any(b < a for a, b in zip(ts, ts[1:])):
            raise ValueError(f"trace {self.name}: arrivals must be sorted by time")
        if ts and (ts[0] < 0 or ts[-1] > self.duration_s + 1e-9):
            raise ValueError(f"trace {self.name}: arrivals must lie in [0, duration_s={self.duration_s}]")

    def __len__(self) -> int:
        return len(self.requests)

    def rate(self, bin_s: float = 1.0) -> list[float]:
        """Arrivals per second in consecutive bins of ``bin_s`` seconds."""
        n = max(1, math.ceil(self.duration_s / bin_s))
        counts = [0] * n
        for r in self.requests:
            counts[min(n - 1, int(r.t / bin_s))] += 1
        return [c / bin_s for c in counts]

    def summary(self) -> dict[str, Any]:
        rates = self.rate(1.0)
        n = max(len(self.requests), 1)
        return {"name": self.name, "requests": len(self.requests), "duration_s": self.duration_s,
                "mean_rps": len(self.requests) / self.duration_s if self.duration_s else 0.0,
                "peak_rps_1s": max(rates, default=0.0),
                "zero_seconds_fraction": sum(1 for r in rates if r == 0) / max(len(rates), 1),
                "mean_prompt_tokens": sum(r.prompt_tokens for r in self.requests) / n,
                "mean_output_tokens": sum(r.output_tokens for r in self.requests) / n}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write ``timestamp,prompt_tokens,output_tokens`` rows (``.csv``) or JSON lines (any other suffix)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.suffix == ".csv":
            with open(p, "w", newline="", encoding="utf-8") as fh:
                w = csv.writer(fh)
                w.writerow(["timestamp", "prompt_tokens", "output_tokens"])
                for r in self.requests:
                    w.writerow([f"{r.t:.6f}", r.prompt_tokens, r.output_tokens])
        else:
            with open(p, "w", encoding="utf-8") as fh:
                for r in self.requests:
                    fh.write(json.dumps({"timestamp": round(r.t, 6), "prompt_tokens": r.prompt_tokens,
                                         "output_tokens": r.output_tokens}) + "\n")
        return p


# ------------------------------------------------------------------------------------------- rate curves


def _burst_curve(shape: BurstShape) -> np.ndarray:
    t = np.arange(0.0, shape.duration_s, _DT)
    phase = (t - shape.first_peak_s) % shape.period_s
    on = (t >= shape.first_peak_s) & (phase < shape.peak_s)
    return np.where(on, shape.peak_rps, shape.base_rps)


def _production_curve(shape: ProductionShape, rng: np.random.Generator) -> np.ndarray:
    n = int(round(shape.duration_s / _DT))
    # background: OU process on the log-rate, exact discretisation
    a = math.exp(-_DT / shape.drift_tau_s)
    noise = rng.normal(0.0, shape.drift_sigma * math.sqrt(1 - a * a), n)
    x = np.empty(n)
    x[0] = rng.normal(0.0, shape.drift_sigma)
    for i in range(1, n):
        x[i] = a * x[i - 1] + noise[i]
    background = shape.base_rps * np.exp(x)

    def regime(mean_on: float, mean_off: float, start_on: bool) -> np.ndarray:
        out = np.zeros(n, dtype=bool)
        i, on = 0, start_on
        while i < n:
            length = max(1, int(rng.exponential(mean_on if on else mean_off) / _DT))
            out[i:i + length] = on
            i += length
            on = not on
        return out

    active = regime(shape.on_mean_s, shape.quiet_mean_s, True)
    storm = regime(shape.storm_mean_s, shape.storm_every_s, False)
    rate = np.where(active, background, background * shape.quiet_factor)

    # burst starts: thinning of a Poisson process whose intensity rises in storms and drops when quiet
    p_base = _DT / shape.burst_every_s
    intensity = p_base * np.where(storm, shape.storm_burst_factor, 1.0) * np.where(active, 1.0, 0.2)
    starts = np.nonzero(rng.random(n) < intensity)[0]
    heights, bursts = [], []
    for s in starts:
        h = min(shape.burst_cap_rps, shape.burst_scale_rps * (rng.pareto(shape.burst_alpha) + 1.0))
        length = min(shape.burst_max_s, float(rng.lognormal(math.log(shape.burst_median_s), shape.burst_sigma)))
        heights.append(h)
        bursts.append((int(s), length))
    if shape.min_spike_rps and (not heights or max(heights) < shape.min_spike_rps):
        s = int(rng.integers(0, n))
        bursts.append((s, shape.burst_median_s))
        heights.append(shape.min_spike_rps)
    tt = np.arange(n) * _DT
    for (s, length), h in zip(bursts, heights):
        t0 = s * _DT
        rise = np.clip((tt - t0) / 0.5, 0.0, 1.0)
        tail = np.exp(-np.clip(tt - t0 - length, 0.0, None) / shape.burst_decay_s)
        rate = np.maximum(rate, np.where(tt >= t0, h * rise * tail, 0.0))
    return rate


def rate_curve(name: str, *, seed: int = 0) -> tuple[np.ndarray, dict[str, Any]]:
    """Reference-scale rate (req/s) on a 0.1 s grid for a named trace, and the parameters that made it."""
    if name == "burst-light":
        return _burst_curve(BURST_LIGHT), asdict(BURST_LIGHT)
    if name == "burst-dense":
        return _burst_curve(BURST_DENSE), asdict(BURST_DENSE)
    if name == "production":
        return _production_curve(PRODUCTION, np.random.default_rng(seed)), asdict(PRODUCTION)
    raise ValueError(f"unknown trace {name!r}; choose one of {', '.join(TRACE_NAMES)} or give a trace file")


def generate_trace(name: str, lengths: LengthTable, *, seed: int = 0, scale: float = 1.0, time_scale: float = 1.0,
                   duration_s: float | None = None, max_prompt: int | None = None,
                   max_output: int | None = None) -> Trace:
    """A named trace at ``scale`` x the reference rates, time compressed by ``time_scale``, truncated to
    ``duration_s`` (seconds after compression); arrivals and lengths from ``seed`` (same seed, same trace)."""
    if not scale > 0 or not time_scale > 0:
        raise ValueError(f"scale and time_scale must be > 0, got {scale} and {time_scale}")
    rate, params = rate_curve(name, seed=seed)
    rng = np.random.default_rng([seed, 1])
    dt = _DT * time_scale
    # compressing time by k raises every rate by 1/k per wall second, so the count per burst stays the same
    lam = rate * scale * _DT
    counts = rng.poisson(lam)
    times = np.concatenate([i * dt + np.sort(rng.random(c)) * dt for i, c in enumerate(counts) if c]) \
        if counts.sum() else np.zeros(0)
    total = len(rate) * dt
    if duration_s is not None:
        times = times[times < duration_s]
        total = min(total, duration_s)
    lrng = random.Random(seed * 1_000_003 + 7)
    reqs = []
    for t in times:
        p, o = lengths.sample(lrng, max_prompt=max_prompt, max_output=max_output)
        reqs.append(TraceRequest(float(t), p, o))
    info = {"generator": name, "shape": params, "seed": seed, "scale": scale, "time_scale": time_scale,
            "duration_s": duration_s, "lengths": lengths.source, "max_prompt": max_prompt, "max_output": max_output}
    return Trace(name, tuple(reqs), float(total), info)


# ------------------------------------------------------------------------------------------- trace files

#: Column names public traces use, matched case-insensitively (first found wins). Mooncake: ``timestamp``,
#: ``input_length``, ``output_length``; Azure LLM inference traces: ``TIMESTAMP``, ``ContextTokens``,
#: ``GeneratedTokens``; Splitwise/vLLM-style files: ``arrival_time``, ``num_prefill_tokens``, ``num_decode_tokens``.
TIME_COLUMNS = ("timestamp", "arrival_time", "arrival_timestamp", "time", "t", "ts", "timestamp_ms", "timestamp_us",
                "timestamp_s", "time_ms", "time_us", "time_s")
PROMPT_COLUMNS = ("input_length", "prompt_tokens", "contexttokens", "context_tokens", "num_prefill_tokens",
                  "input_tokens", "prompt_length", "prompt_len", "num_prompt_tokens", "request_tokens")
OUTPUT_COLUMNS = ("output_length", "output_tokens", "generatedtokens", "generated_tokens", "num_decode_tokens",
                  "response_length", "output_len", "completion_tokens", "response_tokens")
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_MAX_LISTED_BAD = 20


@dataclass(frozen=True)
class TraceFile:
    """A validated trace file: arrivals in seconds from its first row, sorted, with the file's own lengths (None
    where the file has no length column), and ``report`` (columns used, time unit and why, bad rows)."""

    path: str
    times_s: tuple[float, ...]
    prompts: tuple[int, ...] | None
    outputs: tuple[int, ...] | None
    report: dict[str, Any]

    def __len__(self) -> int:
        return len(self.times_s)

    @property
    def has_lengths(self) -> bool:
        return self.prompts is not None and self.outputs is not None

    def lengths(self, max_prompt: int | None = None, max_output: int | None = None) -> LengthTable:
        """The file's own (prompt, output) pairs, clipped: the sample the host's capacity is estimated from."""
        if not self.has_lengths:
            raise ValueError(f"trace file {self.path} has no length columns")
        assert self.prompts is not None and self.outputs is not None
        return LengthTable(tuple((min(p, max_prompt or p), min(o, max_output or o))
                                 for p, o in zip(self.prompts, self.outputs)), f"file:{self.path}")

    def index_at(self, t_s: float) -> int:
        """First row at or after ``t_s`` seconds from the file's start."""
        return bisect.bisect_left(self.times_s, t_s)


def parse_trace_columns(spec: str | None) -> dict[str, str]:
    """``time=COL,prompt=COL,output=COL`` (any subset) -> {role: column}."""
    out: dict[str, str] = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        role, sep, col = part.partition("=")
        role = role.strip()
        if not sep or role not in ("time", "prompt", "output") or not col.strip():
            raise ValueError(f"--trace-columns {spec!r}: expected time=COL,prompt=COL,output=COL (any of them)")
        out[role] = col.strip()
    return out


def _pick(names: Sequence[str], wanted: str | None, known: Sequence[str], role: str, path: Path) -> str | None:
    if wanted is not None:
        for n in names:
            if n == wanted or n.lower() == wanted.lower():
                return n
        raise ValueError(f"trace file {path}: no column {wanted!r} for {role} (columns: {', '.join(names)})")
    lower = {n.lower(): n for n in names}
    for k in known:
        if k in lower:
            return lower[k]
    return None


def _time_unit(column: str, names: Sequence[str], values: Sequence[float], given: str | None) -> tuple[float, str]:
    """Seconds per unit of a numeric time column, and the rule that decided it (see docs/benchmarks.md)."""
    if given is not None:
        if given not in _UNITS:
            raise ValueError(f"--trace-time-unit {given!r}: choose s, ms or us")
        return _UNITS[given], f"{given} (given)"
    low = column.lower()
    for suffix in ("_ms", "_us", "_s"):
        if low.endswith(suffix):
            return _UNITS[suffix[1:]], f"{suffix[1:]} (column name {column!r})"
    lower = {n.lower() for n in names}
    if low == "timestamp" and {"input_length", "output_length"} <= lower:
        return 1e-3, "ms (Mooncake layout: timestamp with input_length/output_length)"
    # absolute epoch times: seconds are ~1.7e9 today, milliseconds ~1.7e12, microseconds ~1.7e15
    lo = min(values)
    if lo > 1e14:
        return 1e-6, "us (epoch magnitude)"
    if lo > 1e11:
        return 1e-3, "ms (epoch magnitude)"
    return 1.0, "s (default)"


def _positive_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if v > 0 else None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) and f == int(f) and f > 0 else None


def read_trace_file(path: str | os.PathLike[str], *, columns: dict[str, str] | None = None,
                    time_unit: str | None = None, skip_bad: bool = False) -> TraceFile:
    """Read and validate a CSV (``.csv``; a header row) or JSON-lines trace file, without a host.

    Time: numbers (unit from ``time_unit`` or :func:`_time_unit`'s rule) or ISO 8601 date-times (Azure's
    ``2023-11-16 18:15:46.6805900``; naive and zoned ones are not mixed); shifted so the earliest row is 0 and
    sorted. Lengths must be positive integers where their column exists. A row that fails (bad JSON, missing or
    unparsable time, bad length) is counted with its line number; any such row raises unless ``skip_bad``, so a
    broken file is refused before minutes of host start-up and calibration are spent on it."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trace file {p} does not exist (or is not a file)")
    columns = dict(columns or {})
    raw: list[tuple[int, dict[str, Any]]] = []
    bad: list[tuple[int, str]] = []
    unparsed = 0  # lines that are not a JSON object: rows of the file, but not in ``raw``
    if p.suffix.lower() == ".csv":
        with open(p, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            names = [n for n in (reader.fieldnames or []) if n is not None]
            for row in reader:
                raw.append((reader.line_num, row))
    else:
        names_seen: dict[str, None] = {}
        with open(p, encoding="utf-8") as fh:
            for ln, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    bad.append((ln, f"not JSON ({exc.msg})"))
                    unparsed += 1
                    continue
                if not isinstance(obj, dict):
                    bad.append((ln, "not a JSON object"))
                    unparsed += 1
                    continue
                for k in obj:
                    names_seen.setdefault(k, None)
                raw.append((ln, obj))
        names = list(names_seen)
    if not raw and not bad:
        raise ValueError(f"trace file {p} has no rows")
    tcol = _pick(names, columns.get("time"), TIME_COLUMNS, "time", p)
    if tcol is None:
        raise ValueError(f"trace file {p}: no time column (recognised: {', '.join(TIME_COLUMNS)}; or map one with "
                         f"--trace-columns time=COL); columns: {', '.join(names)}")
    pcol = _pick(names, columns.get("prompt"), PROMPT_COLUMNS, "prompt", p)
    ocol = _pick(names, columns.get("output"), OUTPUT_COLUMNS, "output", p)
    if (pcol is None) != (ocol is None):
        raise ValueError(f"trace file {p}: found a {'prompt' if pcol else 'output'} length column but not the other "
                         "(map both with --trace-columns prompt=COL,output=COL)")

    from datetime import datetime

    times: list[tuple[float, int, int | None, int | None]] = []  # (raw time, line, prompt, output)
    kind: str | None = None  # "number" or "datetime", fixed by the first good row
    zoned: bool | None = None
    for ln, row in raw:
        v = row.get(tcol)
        if v is None or (isinstance(v, str) and not v.strip()):
            bad.append((ln, f"no {tcol}"))
            continue
        t: float | None = None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            t, k = float(v), "number"
        else:
            try:
                t, k = float(str(v).strip()), "number"
            except ValueError:
                try:
                    dt = datetime.fromisoformat(str(v).strip().replace("Z", "+00:00"))
                except ValueError:
                    bad.append((ln, f"{tcol}={v!r} is neither a number nor an ISO date-time"))
                    continue
                if zoned is None:
                    zoned = dt.tzinfo is not None
                if (dt.tzinfo is not None) != zoned:
                    bad.append((ln, f"{tcol}={v!r} mixes zoned and naive date-times"))
                    continue
                t, k = dt.timestamp(), "datetime"
        if not math.isfinite(t):
            bad.append((ln, f"{tcol}={v!r} is not finite"))
            continue
        if kind is None:
            kind = k
        elif k != kind:
            bad.append((ln, f"{tcol}={v!r}: a {k} among {kind} timestamps"))
            continue
        pt = ot = None
        if pcol is not None and ocol is not None:
            pt, ot = _positive_int(row.get(pcol)), _positive_int(row.get(ocol))
            if pt is None or ot is None:
                bad.append((ln, f"lengths {pcol}={row.get(pcol)!r}, {ocol}={row.get(ocol)!r} are not positive "
                                "integers"))
                continue
        times.append((t, ln, pt, ot))
    bad.sort()
    report: dict[str, Any] = {"path": str(p), "rows": len(raw) + unparsed,
                              "usable_rows": len(times), "bad_rows": len(bad),
                              "bad_lines": [ln for ln, _ in bad[:_MAX_LISTED_BAD]],
                              "columns": {"time": tcol, "prompt": pcol, "output": ocol}}
    if bad and not skip_bad:
        listed = "; ".join(f"line {ln}: {why}" for ln, why in bad[:5])
        raise ValueError(f"trace file {p}: {len(bad)} bad row(s) ({listed}{'; ...' if len(bad) > 5 else ''}); fix "
                         "them or pass --trace-skip-bad to drop them")
    if not times:
        raise ValueError(f"trace file {p}: no usable rows ({len(bad)} bad)")
    if kind == "datetime":
        scale, why = 1.0, "ISO date-times"
    else:
        scale, why = _time_unit(tcol, names, [t for t, *_ in times], time_unit)
    report["time_unit"] = why
    report["sorted_in_file"] = all(a[0] <= b[0] for a, b in zip(times, times[1:]))
    times.sort(key=lambda x: (x[0], x[1]))
    t0 = times[0][0]
    ts = tuple((t - t0) * scale for t, *_ in times)
    report["span_s"] = ts[-1]
    has = pcol is not None
    return TraceFile(str(p), ts, tuple(x[2] for x in times) if has else None,  # type: ignore[misc]
                     tuple(x[3] for x in times) if has else None, report)  # type: ignore[misc]


def auto_file_factor(tf: TraceFile, *, start_s: float, duration_s: float | None, target_rps: float) -> float:
    """Replay seconds per file second such that the replayed window's *mean* arrival rate is ``target_rps``.

    The window starts at ``start_s`` (file seconds) and holds round(target x duration) rows (or every row from
    there when ``duration_s`` is None or the file runs out): its span in file time fixes the factor. The mean, not
    the peak: a real trace's 1-s peaks are Poisson noise on a few requests, and load x capacity is a sustained
    rate the host can serve."""
    if not target_rps > 0:
        raise ValueError(f"target rate must be > 0, got {target_rps}")
    i0 = tf.index_at(start_s)
    rest = len(tf) - i0
    if rest < 2:
        raise ValueError(f"trace file {tf.path}: fewer than 2 arrivals after --trace-start {start_s} s")
    n = rest if duration_s is None else min(rest, max(2, round(target_rps * duration_s)))
    # up to the first arrival left out; when the file runs out first, its last arrival (the replay then ends early)
    span = (tf.times_s[i0 + n] if n < rest else tf.times_s[-1]) - start_s
    if span <= 0:
        raise ValueError(f"trace file {tf.path}: the window after {start_s} s has no time extent")
    return (n / target_rps) / span


def window_trace(tf: TraceFile, *, factor: float, start_s: float = 0.0, duration_s: float | None = None,
                 lengths: LengthTable | None = None, seed: int = 0, max_prompt: int | None = None,
                 max_output: int | None = None, name: str | None = None) -> Trace:
    """The replayed trace: rows from ``start_s`` (file seconds), at ``factor`` replay seconds per file second,
    truncated at ``duration_s`` replay seconds; the file's own lengths clipped to ``max_prompt``/``max_output``
    (counted in ``params``), or drawn from ``lengths`` when the file has none."""
    if not factor > 0:
        raise ValueError(f"time factor must be > 0, got {factor}")
    if not tf.has_lengths and lengths is None:
        raise ValueError(f"trace file {tf.path} lacks prompt/output lengths; give a length source")
    lrng = random.Random(seed * 1_000_003 + 7)
    reqs: list[TraceRequest] = []
    clipped_p = clipped_o = 0
    for i in range(tf.index_at(start_s), len(tf)):
        t = (tf.times_s[i] - start_s) * factor
        if duration_s is not None and t >= duration_s:
            break
        if tf.prompts is not None and tf.outputs is not None:
            pt, ot = tf.prompts[i], tf.outputs[i]
        else:
            assert lengths is not None
            pt, ot = lengths.sample(lrng)
        if max_prompt is not None and pt > max_prompt:
            pt, clipped_p = max_prompt, clipped_p + 1
        if max_output is not None and ot > max_output:
            ot, clipped_o = max_output, clipped_o + 1
        reqs.append(TraceRequest(t, max(pt, 1), max(ot, 1)))
    if not reqs:
        raise ValueError(f"trace file {tf.path}: no arrival in the window from {start_s} s")
    total = duration_s if duration_s is not None else reqs[-1].t
    params = {"generator": "file", **tf.report, "trace_start_s": start_s, "time_factor": factor,
              "file_window_s": total / factor, "duration_s": duration_s,
              "lengths": "file" if tf.has_lengths else (lengths.source if lengths else None),
              "max_prompt": max_prompt, "max_output": max_output,
              "prompts_clipped": clipped_p, "outputs_clipped": clipped_o}
    return Trace(name or Path(tf.path).stem, tuple(reqs), float(total), params)


def load_trace(path: str | os.PathLike[str], lengths: LengthTable | None = None, *, seed: int = 0,
               scale: float = 1.0, duration_s: float | None = None, max_prompt: int | None = None,
               max_output: int | None = None, columns: dict[str, str] | None = None, time_unit: str | None = None,
               start_s: float = 0.0, time_scale: float = 1.0, skip_bad: bool = False) -> Trace:
    """Replay a recorded trace (:func:`read_trace_file`) at ``scale`` x its own rate, time compressed by
    ``time_scale`` (both divide the gaps), from ``start_s`` file seconds, truncated at ``duration_s``."""
    if not scale > 0 or not time_scale > 0:
        raise ValueError(f"scale and time_scale must be > 0, got {scale} and {time_scale}")
    tf = read_trace_file(path, columns=columns, time_unit=time_unit, skip_bad=skip_bad)
    tr = window_trace(tf, factor=time_scale / scale, start_s=start_s, duration_s=duration_s, lengths=lengths,
                      seed=seed, max_prompt=max_prompt, max_output=max_output)
    return Trace(tr.name, tr.requests, tr.duration_s, {**tr.params, "scale": scale, "time_scale": time_scale})


def capacity_scale(capacity_rps: float, load: float = 0.8, reference_peak_rps: float = REFERENCE_PEAK_RPS) -> float:
    """Rate multiplier mapping the reference peak (120 req/s, burst-dense) to ``load`` x ``capacity_rps``."""
    if not capacity_rps > 0 or not load > 0:
        raise ValueError(f"capacity_rps and load must be > 0, got {capacity_rps} and {load}")
    return load * capacity_rps / reference_peak_rps


def estimate_capacity_rps(prefill_s: Callable[[int], float], decode_step_s: Callable[[int, int], float],
                          trace_lengths: Sequence[tuple[int, int]], batch: int = 16) -> float:
    """Requests per second a host sustains: each request costs its prefill plus its output tokens at a decode
    batch of ``batch`` (its share of each decode step), priced by the host's calibrated latency model."""
    if not trace_lengths:
        raise ValueError("no lengths to estimate capacity from")
    cost = 0.0
    for p, o in trace_lengths:
        cost += prefill_s(p) + o * decode_step_s(batch, batch * (p + o // 2)) / batch
    return len(trace_lengths) / cost
