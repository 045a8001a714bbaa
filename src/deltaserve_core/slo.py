"""Inference SLOs and the per-step latency budget Δ of §3.3 (Equation III) and Algorithm 1, lines 8-10.

Who uses it and why: :mod:`deltaserve_core.admission` calls :func:`step_budget` once per scheduling step to
learn how long the step it is about to augment may take without any inference request missing its SLO.
The three ``*_slack`` functions are the per-request rules, kept tiny and pure so tests can check them by
hand; :func:`step_budget` applies them to every request of a :class:`~deltaserve_core.types.ProposedBatch`
in one pass (inlined for speed -- it is on the engine's critical path -- and tested against the pure
functions).

The rules (all times in seconds, ``now`` = ``batch.now``; Δ is the longest the *upcoming step* may run):

* **TTFT** (Eq. III), for every request that has not produced its first token yet, scheduled *or* waiting:
  ``T_SLO − (now − t_arrival)``. Queue wait counts because the clock started at arrival. The paper names
  "the earliest-arriving request"; with per-request SLO overrides the binding request is the one with the
  earliest *deadline* ``t_arrival + T_SLO``, which is the earliest-arriving one when SLOs are uniform.
  A *waiting* request additionally sits out this step and then needs its own prefill step before its first
  token, so its slack is reduced by a lower bound of that step's cost
  (:meth:`~deltaserve_core.latency_model.LatencyModel.min_prefill_time` of its ``prefill_tokens``).
  A scheduled prefill chunk is charged nothing further: the chunks after it are unknown to the core.
* **TPOT**, for every request that has produced a token: ``T_tpot − (now − t_last)`` -- the time already
  spent since its last token is gone. On hosts *without* mixed batches, the decodes this prefill step defers
  (``batch.deferred_decodes``) must still run a decode step ``D_wait`` after it, so their slack is also
  reduced by ``E.predict(D_wait)`` (Eq. II over all deferred decodes). On mixed hosts D_wait is empty (the
  paper's line 9); decodes they leave waiting (preempted requests) are not charged.
* **Average TPOT** (beyond the paper): a request with ``k`` output tokens whose next token lands at ``t``
  has mean inter-token time ``(t − t_first) / k``; keeping it ≤ ``avg_tpot`` gives slack
  ``avg_tpot · k − (now − t_first)`` (minus D_wait for deferred decodes).
* **Fine-tuning-only step** (nothing scheduled): no request is slowed by the step itself except one that
  arrives while it runs. Δ is capped by ``ft_only_budget_s`` (default: the TPOT SLO), so an arrival waits
  at most about one decode interval -- and hosts with ``supports_abort`` cut that to one layer.

Δ is the minimum over all of these; +inf components mean "no request of that kind".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .types import ExecutionMode, ProposedBatch, RequestSLO

if TYPE_CHECKING:
    from .latency_model import LatencyModel

__all__ = [
    "SLOConfig",
    "StepBudget",
    "ttft_slack",
    "tpot_slack",
    "avg_tpot_slack",
    "deferred_decode_cost",
    "step_budget",
    "SLOMonitor",
]

_INF = math.inf


def _check_positive(owner: str, name: str, value: object, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive, finite number of seconds, got {value!r}; {hint}")


@dataclass(frozen=True, slots=True)
class SLOConfig:
    """The job's default inference SLOs (seconds); requests may override any field with a :class:`RequestSLO`.

    ``ttft_s``: time to first token, from arrival. ``tpot_s``: maximum time between two consecutive output
    tokens of one request. ``avg_tpot_s``: optional bound on the *mean* inter-token time of a request
    (a looser, throughput-style objective; ``None`` disables it).
    """

    ttft_s: float
    tpot_s: float
    avg_tpot_s: float | None = None

    def __post_init__(self) -> None:
        _check_positive("SLOConfig", "ttft_s", self.ttft_s,
                        "set the time-to-first-token SLO, e.g. ttft_s=1.0 (a zero or negative SLO can never be met)")
        _check_positive("SLOConfig", "tpot_s", self.tpot_s,
                        "set the time-per-output-token SLO, e.g. tpot_s=0.1 (a zero or negative SLO can never be met)")
        if self.avg_tpot_s is not None:
            _check_positive("SLOConfig", "avg_tpot_s", self.avg_tpot_s,
                            "set a positive average-TPOT SLO or leave it as None to disable it")

    def for_request(self, override: RequestSLO | None) -> tuple[float, float, float | None]:
        """``(ttft_s, tpot_s, avg_tpot_s)`` for a request: its overrides where set, the job defaults elsewhere."""
        if override is None:
            return self.ttft_s, self.tpot_s, self.avg_tpot_s
        return (
            self.ttft_s if override.ttft_s is None else override.ttft_s,
            self.tpot_s if override.tpot_s is None else override.tpot_s,
            self.avg_tpot_s if override.avg_tpot_s is None else override.avg_tpot_s,
        )


# ------------------------------------------------------------------------------------ per-request rules


def ttft_slack(now: float, arrival_time: float, ttft_s: float, remaining_cost_s: float = 0.0) -> float:
    """Eq. III: ``ttft_s − (now − arrival_time)``, minus work that must still follow this step before the
    first token (``remaining_cost_s``: a waiting request's own prefill step; 0 for a scheduled one)."""
    return ttft_s - (now - arrival_time) - remaining_cost_s


def tpot_slack(now: float, last_token_time: float, tpot_s: float, deferred_cost_s: float = 0.0) -> float:
    """``tpot_s − (now − last_token_time)``, minus the deferred decode step that must follow this one
    (``deferred_cost_s``: ``E.predict(D_wait)`` for a decode this step defers; 0 when it decodes in this step)."""
    return tpot_s - (now - last_token_time) - deferred_cost_s


def avg_tpot_slack(
    now: float, first_token_time: float, output_tokens: int, avg_tpot_s: float, deferred_cost_s: float = 0.0
) -> float:
    """Time this step may take so that, when the request's next token lands, its mean inter-token time
    ``(t_next − first_token_time) / output_tokens`` is still ≤ ``avg_tpot_s``.

    ``output_tokens`` counts tokens produced so far (≥ 1 once a first token exists; 0 is read as 1).
    """
    return avg_tpot_s * max(output_tokens, 1) - (now - first_token_time) - deferred_cost_s


def deferred_decode_cost(
    model: LatencyModel | None, num_decode: int, kv_tokens: int, mode: ExecutionMode | None = None
) -> float:
    """``E.predict(D_wait)``: the decode-only step (Eq. II) that deferred decodes still need after this step.

    ``mode`` is the mode the host will run that decode step in when the caller knows it (from
    ``host.graph_mode``); ``None`` takes the slower of the modes -- the safe side for an SLO.
    """
    if model is None or num_decode == 0:
        return 0.0
    if mode is not None:
        return model.predict((), num_decode, kv_tokens, (), mode)
    return max(model.predict((), num_decode, kv_tokens, (), m) for m in ExecutionMode)


# ------------------------------------------------------------------------------------------- whole step


@dataclass(frozen=True, slots=True)
class StepBudget:
    """Δ for one step and where it came from, plus the inference batch's shape.

    ``ttft``, ``tpot``, ``avg_tpot``: the tightest slack of each kind (+inf when no request has that kind);
    ``ft_only``: the fine-tuning-only cap (+inf unless nothing is scheduled); ``delta`` their minimum.
    ``binding``: which of those four set Δ (``"none"`` if none did); ``request_id``: the request that did.
    ``deferred_cost``: the predicted D_wait charged to deferred decodes (0 on mixed hosts).

    The shape of the scheduled batch is collected in the same pass, so admission needs no second one:
    ``num_prefill`` rows with ``prefill_tokens`` = Σnᵢ and ``prefill_sq`` = Σnᵢ², ``num_decode`` = B_d rows
    reading ``kv_tokens`` = K.
    """

    delta: float
    ttft: float
    tpot: float
    avg_tpot: float
    ft_only: float
    binding: str
    request_id: str | None
    deferred_cost: float = 0.0
    num_prefill: int = 0
    prefill_tokens: int = 0
    prefill_sq: int = 0
    num_decode: int = 0
    kv_tokens: int = 0


def step_budget(
    batch: ProposedBatch,
    slo: SLOConfig,
    model: LatencyModel | None = None,
    *,
    mixed_batches: bool = True,
    deferred_mode: ExecutionMode | None = None,
    ft_only_budget_s: float | None = None,
) -> StepBudget:
    """Δ = min(TTFT slack with queue wait, TPOT slack, average-TPOT slack[, fine-tuning-only cap]).

    Called by admission once per step (scheduling process, hot path: one pass over scheduled and waiting
    requests, float arithmetic only). ``model`` prices the waiting requests' own prefill steps and D_wait;
    without one those costs are taken as 0. ``mixed_batches`` is the host capability: False makes the
    decodes in ``batch.waiting`` deferred work charged to TPOT. ``deferred_mode``: see
    :func:`deferred_decode_cost`. ``ft_only_budget_s`` caps Δ for a step with nothing scheduled
    (default ``slo.tpot_s``).
    """
    now = batch.now
    def_ttft, def_tpot, def_avg = slo.ttft_s, slo.tpot_s, slo.avg_tpot_s
    # Hot loop over requests on the job's default SLO: track the earliest *clock start* (arrival for TTFT,
    # last token for TPOT) and add the SLO once at the end; requests with overrides are settled afterwards.
    min_arrival = min_last = d_avg = _INF
    r_ttft = r_tpot = r_avg = None
    special: list = []
    sq = lin = p = kv = 0

    scheduled = batch.scheduled
    for r in scheduled:
        n = r.prefill_tokens
        if n:
            sq += n * n
            lin += n
            p += 1
        else:
            kv += r.context_tokens
        if r.slo is not None:
            special.append(r)
            continue
        first = r.first_token_time
        if first is None:
            t = r.arrival_time
            if t < min_arrival:
                min_arrival, r_ttft = t, r
            continue
        last = r.last_token_time
        t = first if last is None else last
        if t < min_last:
            min_last, r_tpot = t, r
        if def_avg is not None:
            k = r.output_tokens
            t = first + def_avg * (k if k > 1 else 1)
            if t < d_avg:
                d_avg, r_avg = t, r

    # Waiting requests: a prefill still queued also needs its own prefill step after this one (lower bound
    # from the model's cheapest coefficients, inlined: a method call per request would double the cost).
    fa, fb, fc = model.prefill_floor_coefficients() if model is not None else (0.0, 0.0, 0.0)
    d_ttft = _INF if r_ttft is None else min_arrival + def_ttft
    deferred: list = []
    for r in batch.waiting:
        first = r.first_token_time
        if first is None:
            o = r.slo
            n = r.prefill_tokens
            own = fa * (n * n) + fb * n + fc
            t = r.arrival_time + (def_ttft if o is None or o.ttft_s is None else o.ttft_s) - own
            if t < d_ttft:
                d_ttft, r_ttft = t, r
        elif not mixed_batches:
            deferred.append(r)

    d_tpot = _INF if r_tpot is None else min_last + def_tpot
    for r in special:
        o = r.slo
        first = r.first_token_time
        if first is None:
            t = r.arrival_time + (def_ttft if o.ttft_s is None else o.ttft_s)
            if t < d_ttft:
                d_ttft, r_ttft = t, r
            continue
        last = r.last_token_time
        t = (first if last is None else last) + (def_tpot if o.tpot_s is None else o.tpot_s)
        if t < d_tpot:
            d_tpot, r_tpot = t, r
        avg = def_avg if o.avg_tpot_s is None else o.avg_tpot_s
        if avg is not None:
            k = r.output_tokens
            t = first + avg * (k if k > 1 else 1)
            if t < d_avg:
                d_avg, r_avg = t, r

    # Deferred decodes (hosts without mixed batches): deadlines first, D_wait charged once it is known.
    w_tpot = w_avg = _INF
    w_r_tpot = w_r_avg = None
    w_kv = 0
    for r in deferred:
        o = r.slo
        first = r.first_token_time
        w_kv += r.context_tokens
        last = r.last_token_time
        t = (first if last is None else last) + (def_tpot if o is None or o.tpot_s is None else o.tpot_s)
        if t < w_tpot:
            w_tpot, w_r_tpot = t, r
        avg = def_avg if o is None or o.avg_tpot_s is None else o.avg_tpot_s
        if avg is not None:
            k = r.output_tokens
            t = first + avg * (k if k > 1 else 1)
            if t < w_avg:
                w_avg, w_r_avg = t, r
    w_bd = len(deferred)

    deferred_cost = 0.0
    if w_bd:
        deferred_cost = deferred_decode_cost(model, w_bd, w_kv, deferred_mode)
        if w_tpot - deferred_cost < d_tpot:
            d_tpot, r_tpot = w_tpot - deferred_cost, w_r_tpot
        if w_avg - deferred_cost < d_avg:
            d_avg, r_avg = w_avg - deferred_cost, w_r_avg

    ttft = d_ttft - now
    tpot = d_tpot - now
    avg_slack = d_avg - now
    ft_only = _INF
    if not scheduled:
        ft_only = slo.tpot_s if ft_only_budget_s is None else ft_only_budget_s

    delta, binding, who = ttft, "ttft", r_ttft
    if tpot < delta:
        delta, binding, who = tpot, "tpot", r_tpot
    if avg_slack < delta:
        delta, binding, who = avg_slack, "avg_tpot", r_avg
    if ft_only < delta:
        delta, binding, who = ft_only, "ft_only", None
    rid = None if who is None else who.request_id
    if delta == _INF:
        binding = "none"
    return StepBudget(delta, ttft, tpot, avg_slack, ft_only, binding, rid, deferred_cost,
                      p, lin, sq, len(scheduled) - p, kv)


class SLOMonitor:
    """Client SLO attainment as the scheduler sees it, for progress logs where no client-side timing exists
    (``vllm serve``, SGLang's server): every request's TTFT (first token − arrival) and *mean* TPOT from the
    per-request times in the :class:`~deltaserve_core.types.ProposedBatch` views the host offers each step.

    :meth:`observe` is cheap enough for the scheduling path only because it samples: it reads a batch at most
    every ``every_s`` seconds. TTFT and mean TPOT are exact under sampling (they need the first and the latest
    token time, not every token); the worst single gap between two tokens is not visible this way, so the TPOT
    figure is the mean-TPOT check, against ``tpot_s``. A request that starts and finishes between two samples is
    not counted, so the figure leans towards longer requests. Memory is bounded: the oldest of more than
    ``capacity`` tracked requests are folded into the totals.
    """

    def __init__(self, slo: SLOConfig, *, every_s: float = 0.1, capacity: int = 8192) -> None:
        self.slo = slo
        self.every_s = every_s
        self.capacity = capacity
        self._next = 0.0
        # request id -> (TTFT met, mean TPOT met or None before a second token)
        self._live: dict[str, tuple[bool, bool | None]] = {}
        self._folded = [0, 0, 0, 0, 0]  # with a first token, TTFT met, with a TPOT figure, TPOT met, both met

    def observe(self, batch: ProposedBatch) -> None:
        if batch.now < self._next:
            return
        self._next = batch.now + self.every_s
        for views in (batch.scheduled, batch.waiting):
            for r in views:
                if r.first_token_time is None:
                    continue
                ttft_s, tpot_s, _ = self.slo.for_request(r.slo)
                ttft_ok = r.first_token_time - r.arrival_time <= ttft_s
                tpot_ok = None
                if r.output_tokens > 1 and r.last_token_time is not None:
                    tpot_ok = (r.last_token_time - r.first_token_time) / (r.output_tokens - 1) <= tpot_s
                self._live[r.request_id] = (ttft_ok, tpot_ok)
        while len(self._live) > self.capacity:
            _fold(self._folded, *self._live.pop(next(iter(self._live))))

    def attainment(self) -> dict[str, float | int | None]:
        """``requests`` seen with a first token; ``ttft``, ``tpot`` (mean) and ``slo`` (both) attainment as
        fractions, None before any request (or, for ``tpot``, before any request's second token)."""
        totals = list(self._folded)
        for ttft_ok, tpot_ok in self._live.values():
            _fold(totals, ttft_ok, tpot_ok)
        n = totals[0]
        return {"requests": n, "ttft": totals[1] / n if n else None,
                "tpot": totals[3] / totals[2] if totals[2] else None, "slo": totals[4] / n if n else None}


def _fold(totals: list[int], ttft_ok: bool, tpot_ok: bool | None) -> None:
    totals[0] += 1
    totals[1] += ttft_ok
    if tpot_ok is not None:
        totals[2] += 1
        totals[3] += tpot_ok
    totals[4] += ttft_ok and tpot_ok is not False
