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
truncates. Files: :meth:`Trace.save` / :func:`load_trace` (CSV or JSONL with ``timestamp`` and optional
``prompt_tokens``/``output_tokens``), so any recorded trace can be replayed.
"""

from __future__ import annotations

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
    "TRACE_NAMES",
    "BurstShape",
    "ProductionShape",
    "Trace",
    "TraceRequest",
    "capacity_scale",
    "generate_trace",
    "load_trace",
    "rate_curve",
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


def load_trace(path: str | os.PathLike[str], lengths: LengthTable | None = None, *, seed: int = 0,
               scale: float = 1.0, duration_s: float | None = None, max_prompt: int | None = None,
               max_output: int | None = None) -> Trace:
    """Replay a recorded trace: CSV or JSONL rows with ``timestamp`` (seconds; absolute ones are shifted to
    start at 0; also accepted: ``arrival_time``, ``t``) and optionally ``prompt_tokens``/``output_tokens``
    (drawn from ``lengths`` where missing). ``scale`` > 1 replays faster (timestamps divided by it)."""
    p = Path(path)
    if p.suffix == ".csv":
        with open(p, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    else:
        rows = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"trace file {p} has no rows")

    def when(r: dict[str, Any]) -> float:
        for k in ("timestamp", "arrival_time", "t"):
            if k in r and r[k] not in (None, ""):
                return float(r[k])
        raise ValueError(f"trace file {p}: row {r} has no timestamp column (timestamp, arrival_time or t)")

    rows.sort(key=when)
    t0 = when(rows[0])
    lrng = random.Random(seed * 1_000_003 + 7)
    reqs = []
    for r in rows:
        pt, ot = r.get("prompt_tokens"), r.get("output_tokens")
        if pt in (None, "") or ot in (None, ""):
            if lengths is None:
                raise ValueError(f"trace file {p} lacks prompt_tokens/output_tokens; give a length source")
            sp, so = lengths.sample(lrng)
            pt = sp if pt in (None, "") else pt
            ot = so if ot in (None, "") else ot
        pt, ot = int(pt), int(ot)
        if max_prompt is not None:
            pt = min(pt, max_prompt)
        if max_output is not None:
            ot = min(ot, max_output)
        reqs.append(TraceRequest((when(r) - t0) / scale, max(pt, 1), max(ot, 1)))
    if duration_s is not None:
        reqs = [r for r in reqs if r.t < duration_s]
    total = duration_s if duration_s is not None else (reqs[-1].t if reqs else 0.0)
    return Trace(p.stem, tuple(reqs), float(total), {"generator": "file", "path": str(p), "scale": scale,
                                                     "duration_s": duration_s})


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
