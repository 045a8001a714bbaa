"""Metrics of one benchmark run: per request, per system, over time, and the files they are written to.

Times are seconds from the run's start; a request's clock starts at its *scheduled* arrival in the trace, not
when the driver got round to submitting it (a driver busy with a long step submits late, and that wait is the
client's), so TTFT and end-to-end latency include any such delay.

Definitions (all systems alike):

* TTFT = first token − arrival; TPOT = gaps between consecutive tokens (a request meets its TPOT SLO when its
  largest gap does, as the core's admission rule promises); SLO met = TTFT and max TPOT (and mean TPOT when an
  average-TPOT SLO is set) within the SLO; end-to-end = last token − arrival.
* Fine-tuning tokens/s = tokens of samples whose optimizer step *completed* within the window ÷ window (forward
  tokens still waiting for their backward are not counted); inference tokens/s = generated tokens ÷ window.
* Window = from the first scheduled arrival's start (0) to the later of the trace end and the last request's
  finish: every system is charged for its own drain.
* Estimator error = mean |predicted − measured| ÷ measured over the steps the policy priced.
* idle fraction (of the bare host) = 1 − Σ inference step time ÷ window; harvest = FT tok/s ÷ (trainer-alone FT
  tok/s × idle fraction), where trainer-alone is the packed PEFT trainer (:mod:`.split_pool`) with the whole
  device to itself and no inference running: the share of the idle capacity converted to fine-tuning, against
  what a plain trainer would make of it. (DeltaServe's own rate with no inference is reported beside it as a
  diagnostic; dividing by it would hide a slow backward.)
* Headline ratio (:func:`headline`) = DeltaServe FT tok/s ÷ the best FT tok/s among the baselines an operator
  would pick instead (static MPS, split pool at every share, idle-only, LLMStation-style, the paper's rule) that
  held 100 % SLO.
* Tight SLO (:func:`tight_slo`): TPOT = 1.25 × the bare host's p99 step time on the same trace, TTFT = 10/3 × TPOT.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "RequestResult",
    "StepSample",
    "SystemRun",
    "headline",
    "honest_harvest",
    "percentile",
    "request_row",
    "result_paths",
    "rolling_attainment",
    "summarize",
    "tight_slo",
    "timeline",
    "write_results",
]


@dataclass(frozen=True, slots=True)
class RequestResult:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    token_times_s: tuple[float, ...]

    @property
    def ttft_s(self) -> float:
        return self.token_times_s[0] - self.arrival_s

    @property
    def tpots_s(self) -> tuple[float, ...]:
        t = self.token_times_s
        return tuple(b - a for a, b in zip(t, t[1:]))

    @property
    def e2e_s(self) -> float:
        return self.token_times_s[-1] - self.arrival_s

    def meets(self, ttft_s: float, tpot_s: float, avg_tpot_s: float | None = None) -> bool:
        gaps = self.tpots_s
        if self.ttft_s > ttft_s or max(gaps, default=0.0) > tpot_s:
            return False
        return avg_tpot_s is None or not gaps or sum(gaps) / len(gaps) <= avg_tpot_s


@dataclass(frozen=True, slots=True)
class StepSample:
    """One executed step: start, duration, inference present, FT tokens, and the policy's prediction (NaN: none)."""

    start_s: float
    duration_s: float
    inference: bool
    ft_tokens: int
    mode: str
    predicted_s: float = math.nan
    prefill_tokens: int = 0
    decodes: int = 0
    ft_rows: int = 0
    #: why the step carried the fine-tuning rows it did (an AdmissionReason value; "" where no co-server decided)
    reason: str = ""


@dataclass
class SystemRun:
    system: str
    window_s: float
    requests: list[RequestResult]
    ft_steps: list[tuple[float, int]] = field(default_factory=list)  # (time, trained tokens) per optimizer step
    steps: list[StepSample] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), NaN for no values."""
    if not values:
        return math.nan
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(run: SystemRun, *, ttft_s: float, tpot_s: float, avg_tpot_s: float | None = None,
              dedicated_ft_tok_s: float | None = None, idle_fraction: float | None = None) -> dict[str, Any]:
    reqs = run.requests
    w = run.window_s
    ft_tokens = sum(n for t, n in run.ft_steps if t <= w)
    out_tokens = sum(len(r.token_times_s) for r in reqs)
    e2e = [r.e2e_s for r in reqs]
    ttft = [r.ttft_s for r in reqs]
    max_tpot = [max(r.tpots_s, default=0.0) for r in reqs]
    mean_tpot = [sum(r.tpots_s) / len(r.tpots_s) for r in reqs if r.tpots_s]
    ok = [r.meets(ttft_s, tpot_s, avg_tpot_s) for r in reqs]
    errs: dict[str, list[float]] = {}
    for s in run.steps:
        if s.predicted_s == s.predicted_s and s.duration_s > 0:
            errs.setdefault(s.mode, []).append(abs(s.predicted_s - s.duration_s) / s.duration_s)
    all_errs = [e for v in errs.values() for e in v]
    # signed (predicted - measured) / measured by step kind: whether misses come from under-priced mixed steps
    signed: dict[str, list[float]] = {}
    for s in run.steps:
        if s.predicted_s == s.predicted_s and s.duration_s > 0:
            kind = "mixed" if s.inference and s.ft_tokens else "finetune_only" if s.ft_tokens else "inference_only"
            signed.setdefault(kind, []).append((s.predicted_s - s.duration_s) / s.duration_s)
    ft_tok_s = ft_tokens / w if w > 0 else 0.0
    harvest = honest_harvest(ft_tok_s, dedicated_ft_tok_s, idle_fraction)
    busy = sum(s.duration_s for s in run.steps if s.inference)
    # where the fine-tuning forward rows rode: alone, next to decodes only, or in steps with prefill
    ft_alone = sum(s.ft_tokens for s in run.steps if not s.inference)
    ft_prefill = sum(s.ft_tokens for s in run.steps if s.inference and s.prefill_tokens)
    ft_decode = sum(s.ft_tokens for s in run.steps if s.inference and not s.prefill_tokens)
    return {
        "system": run.system, "window_s": w, "requests": len(reqs),
        "finetune_tokens": ft_tokens, "finetune_tokens_per_s": ft_tok_s,
        "inference_tokens_per_s": out_tokens / w if w > 0 else 0.0,
        "prompt_tokens_per_s": sum(r.prompt_tokens for r in reqs) / w if w > 0 else 0.0,
        "slo_attainment": sum(ok) / len(ok) if ok else math.nan,
        "ttft_attainment": sum(t <= ttft_s for t in ttft) / len(ttft) if ttft else math.nan,
        "tpot_attainment": sum(t <= tpot_s for t in max_tpot) / len(max_tpot) if max_tpot else math.nan,
        "mean_e2e_s": _mean(e2e), "p95_e2e_s": percentile(e2e, 95),
        "mean_ttft_s": _mean(ttft), "p95_ttft_s": percentile(ttft, 95),
        "p95_max_tpot_s": percentile(max_tpot, 95), "max_tpot_s": max(max_tpot, default=math.nan),
        # vLLM's benchmark conventions: TPOT = a request's mean time per output token after the first, ITL = every
        # gap between tokens pooled
        "p50_ttft_s": percentile(ttft, 50), "p99_ttft_s": percentile(ttft, 99),
        "p50_tpot_s": percentile(mean_tpot, 50), "p99_tpot_s": percentile(mean_tpot, 99),
        "p99_itl_s": percentile([g for r in reqs for g in r.tpots_s], 99),
        "estimator_error": _mean(all_errs) if all_errs else None,
        "estimator_error_by_mode": {m: _mean(v) for m, v in errs.items()},
        "estimator_steps": len(all_errs),
        "estimator_signed_error_by_kind": {k: {"mean": _mean(v), "steps": len(v)} for k, v in signed.items()},
        # a step with inference that outlasts the TPOT SLO breaks it for every decode in it
        "inference_steps_over_tpot": sum(1 for s in run.steps if s.inference and s.duration_s > tpot_s),
        "inference_steps_over_tpot_with_finetune": sum(1 for s in run.steps
                                                       if s.inference and s.ft_tokens and s.duration_s > tpot_s),
        "inference_busy_fraction": busy / w if w > 0 else math.nan,
        "harvest": harvest,
        "ft_forward_tokens_alone": ft_alone, "ft_forward_tokens_with_prefill": ft_prefill,
        "ft_forward_tokens_with_decode_only": ft_decode,
        **run.extra,
    }


def saturation_summary(token_times: Sequence[Sequence[float]], prompt_tokens: int) -> dict[str, Any]:
    """Throughput at saturation: every request submitted at 0, ``token_times`` in seconds from then (one
    sequence per request); output tokens per second until the last token."""
    out_tokens = sum(len(t) for t in token_times)
    end = max((t[-1] for t in token_times if t), default=0.0)
    return {"requests": len(token_times), "output_tokens": out_tokens, "prompt_tokens": prompt_tokens,
            "makespan_s": end, "output_tokens_per_s": out_tokens / end if end > 0 else None}


def honest_harvest(ft_tok_s: float, trainer_alone_tok_s: float | None, idle_fraction: float | None) -> float | None:
    """FT tok/s ÷ (the packed PEFT trainer alone on the whole device × the bare host's idle fraction); None when
    either is unknown or zero."""
    if not trainer_alone_tok_s or not idle_fraction:
        return None
    return ft_tok_s / (trainer_alone_tok_s * idle_fraction)


#: TPOT = this x the bare host's p99 step time under the trace (the tight regime); TTFT = 10/3 x TPOT, the paper's
#: ratio (400 ms / 120 ms).
TIGHT_TPOT_FACTOR = 1.25
TIGHT_QUANTILE = 99.0


def tight_slo(steps: Sequence[StepSample]) -> tuple[float, float, dict[str, Any]]:
    """(TTFT, TPOT, derivation) of the tight regime from the bare host's executed steps with inference.

    Why from the bare host on the same trace: on a fast device the paper's 120 ms TPOT is many times a step, so
    any co-location looks free; a TPOT a quarter above what the engine alone needs leaves only the slack a
    co-server must find, not slack the SLO hands out."""
    durations = [s.duration_s for s in steps if s.inference]
    if not durations:
        raise ValueError("the tight SLO regime needs the bare host's steps with inference; it ran none")
    p = percentile(durations, TIGHT_QUANTILE)
    tpot = TIGHT_TPOT_FACTOR * p
    return tpot * 10.0 / 3.0, tpot, {
        "rule": f"TPOT = {TIGHT_TPOT_FACTOR} x bare's p{TIGHT_QUANTILE:g} step time; TTFT = 10/3 x TPOT",
        "bare_steps": len(durations), "bare_p99_step_s": p, "bare_max_step_s": max(durations),
        "bare_median_step_s": percentile(durations, 50)}


def headline(summaries: dict[str, dict[str, Any]], *, deltaserve: str = "deltaserve") -> dict[str, Any]:
    """DeltaServe's FT rate against the best baseline that held 100 % SLO, and per share family (``static_mps``,
    ``split_pool``) the largest share that did. ``summaries`` are one SLO regime's, keyed by system name
    (``static_mps@25``); a baseline below 100 % SLO is not a configuration an operator could run."""
    from . import HEADLINE_BASELINES, family

    ds = summaries.get(deltaserve)
    best_name, best = None, -1.0
    shares: dict[str, dict[str, Any]] = {}
    for name, s in summaries.items():
        fam = family(name)
        if fam not in HEADLINE_BASELINES:
            continue
        held = s.get("slo_attainment") == 1.0
        if "@" in name:
            share = int(name.split("@", 1)[1].split("/", 1)[0])
            entry = shares.setdefault(fam, {"largest_share_at_100pct_slo": None, "tried": []})
            entry["tried"].append(share)
            if held and (entry["largest_share_at_100pct_slo"] is None or share > entry["largest_share_at_100pct_slo"]):
                entry["largest_share_at_100pct_slo"] = share
        if held and s["finetune_tokens_per_s"] > best:
            best_name, best = name, s["finetune_tokens_per_s"]
    out: dict[str, Any] = {"best_baseline": best_name, "best_baseline_ft_tok_s": best if best_name else None,
                           "share_sweep": shares, "ratio": None}
    if ds is not None and best_name is not None:
        out["deltaserve_ft_tok_s"] = ds["finetune_tokens_per_s"]
        ft = ds["finetune_tokens_per_s"]
        # a best baseline that trained nothing: DeltaServe wins outright if it trained, else there is no ratio
        out["ratio"] = ft / best if best > 0 else (math.inf if ft > 0 else None)
    return out


def rolling_attainment(reqs: Sequence[RequestResult], ttft_s: float, tpot_s: float, avg_tpot_s: float | None,
                       window_s: float, points: Sequence[float]) -> list[float]:
    """Fraction of requests *arriving* within the trailing ``window_s`` of each point that met the SLO (NaN
    where none arrived)."""
    marks = sorted((r.arrival_s, r.meets(ttft_s, tpot_s, avg_tpot_s)) for r in reqs)
    out = []
    for p in points:
        sel = [ok for t, ok in marks if p - window_s < t <= p]
        out.append(sum(sel) / len(sel) if sel else math.nan)
    return out


def timeline(run: SystemRun, *, bin_s: float = 1.0, ttft_s: float, tpot_s: float, avg_tpot_s: float | None = None,
             slo_window_s: float = 10.0) -> dict[str, list[float]]:
    """Per-bin FT and inference token rates and the rolling SLO attainment, for the Figure 5-style panels.

    A backward step's tokens are spread evenly back to the previous step's completion (they were trained over
    that stretch), so the FT band is not a comb of spikes."""
    n = max(1, math.ceil(run.window_s / bin_s))
    ft = [0.0] * n
    prev = 0.0
    for t, k in sorted(run.ft_steps):
        t = min(t, run.window_s)
        lo, hi = prev, max(t, prev + 1e-9)
        i0, i1 = int(lo / bin_s), min(n - 1, int(hi / bin_s))
        for i in range(i0, i1 + 1):
            a, b = max(lo, i * bin_s), min(hi, (i + 1) * bin_s)
            if b > a and i < n:
                ft[i] += k * (b - a) / (hi - lo)
        prev = t
    inf = [0.0] * n
    for r in run.requests:
        for t in r.token_times_s:
            inf[min(n - 1, max(0, int(t / bin_s)))] += 1
    points = [(i + 1) * bin_s for i in range(n)]
    return {"t": [i * bin_s for i in range(n)], "ft_tok_s": [x / bin_s for x in ft],
            "inference_tok_s": [x / bin_s for x in inf],
            "rolling_slo": rolling_attainment(run.requests, ttft_s, tpot_s, avg_tpot_s, slo_window_s, points)}


def request_row(system: str, r: RequestResult, ttft_s: float, tpot_s: float, avg_tpot_s: float | None) -> dict[str, Any]:
    gaps = r.tpots_s
    return {"system": system, "request_id": r.request_id, "arrival_s": round(r.arrival_s, 6),
            "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens, "ttft_s": round(r.ttft_s, 6),
            "max_tpot_s": round(max(gaps, default=0.0), 6), "mean_tpot_s": round(_mean(gaps), 6) if gaps else 0.0,
            "e2e_s": round(r.e2e_s, 6), "slo_met": r.meets(ttft_s, tpot_s, avg_tpot_s)}


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def step_row(system: str, s: StepSample) -> dict[str, Any]:
    """One executed step for ``<stem>_steps.csv``: what explains a missed SLO (an overrunning step, its shape,
    its prediction) or a stall (``ft_reason``: why admission gave the step the rows it did) is only visible per
    step."""
    return {"system": system, "start_s": round(s.start_s, 6), "duration_s": round(s.duration_s, 6),
            "predicted_s": round(s.predicted_s, 6) if s.predicted_s == s.predicted_s else "",
            "mode": s.mode, "prefill_tokens": s.prefill_tokens, "decodes": s.decodes, "ft_rows": s.ft_rows,
            "ft_tokens": s.ft_tokens, "ft_reason": s.reason}


def result_paths(out_dir: str | os.PathLike[str], stem: str) -> dict[str, Path]:
    """Every file a run named ``stem`` may write in ``out_dir`` (the plot included), by kind."""
    d = Path(out_dir)
    return {"json": d / f"{stem}.json", "summary_csv": d / f"{stem}_summary.csv",
            "requests_csv": d / f"{stem}_requests.csv", "steps_csv": d / f"{stem}_steps.csv",
            "png": d / f"{stem}.png"}


def write_results(out_dir: str | os.PathLike[str], stem: str, result: dict[str, Any],
                  request_rows: Sequence[dict[str, Any]],
                  step_rows: Sequence[dict[str, Any]] = ()) -> dict[str, Path]:
    """``<stem>.json`` (everything), ``<stem>_summary.csv`` (one row per system), ``<stem>_requests.csv``,
    ``<stem>_steps.csv`` (one row per executed step, with admission's prediction where it priced the step)."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = result_paths(d, stem)
    del paths["png"]  # the runner draws it
    if not step_rows:
        del paths["steps_csv"]
    tmp = paths["json"].with_suffix(".tmp")
    tmp.write_text(json.dumps(_clean(result), indent=1, default=str))
    os.replace(tmp, paths["json"])
    rows = [{k: v for k, v in s.items() if not isinstance(v, (dict, list))} for s in result["systems"].values()]
    keys: list[str] = []
    for r in rows:
        keys.extend(k for k in r if k not in keys)
    with open(paths["summary_csv"], "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    for key, table in (("requests_csv", request_rows), ("steps_csv", step_rows)):
        if table:
            with open(paths[key], "w", newline="", encoding="utf-8") as fh:
                w = csv.DictWriter(fh, fieldnames=list(table[0]))
                w.writeheader()
                w.writerows(table)
    return paths

