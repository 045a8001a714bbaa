"""The co-serving policies the benchmark compares, each the real core (:class:`~deltaserve_core.coserve.CoServer`) under
one :class:`~deltaserve_core.admission.AdmissionPolicy`.

Every variant is the unmodified controller with one part of its policy changed, so a difference in the numbers is
that part:

* ``deltaserve``: :meth:`AdmissionPolicy.default` (Algorithm 1, fine-tuning-only steps, layer-boundary interruption).
* ``paper_rule``: :meth:`AdmissionPolicy.paper`, Algorithm 1 as the paper states it.
* ``idle_only``: :meth:`AdmissionPolicy.idle_only` admits only into steps with no inference (fine-tuning-only
  steps), and the backward yields to every inference step (``preempt_decode=True``): fine-tuning uses idle time only.
* ``no_interrupt``: :meth:`AdmissionPolicy.no_interrupt` never arms the abort, so a request arriving during a
  fine-tuning-only step waits for it to finish (paper §4.4, Figure 8's DeltaServe-No-INTR).
* ``llmstation``: :func:`llmstation_policy`, an LLMStation-style rule (:class:`LLMStationAdmission`): fine-tuning
  rows only alongside *decode-only* steps (no fine-tuning-only steps, none with prefill), priced by
  :class:`ShapeCacheLatency`, a per-shape table of observed step times that pools CUDA-graph and eager steps (a
  graph-replayed decode step and the same step made eager by the fine-tuning rows share one entry), against a
  static per-step budget of the TPOT SLO: time already spent since a request's last token and queued requests'
  TTFT are not charged. This is our reading of the policy the paper compares against, not LLMStation's code
  (which is not public).

:class:`PredictionLog` observes every decision (``CoServer.decision_observers``) for the estimator-error metric.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable

from ..admission import Admission, AdmissionDecision, AdmissionPolicy, AdmissionPool, AdmissionReason
from ..latency_model import LatencyModel
from ..slo import SLOConfig
from ..types import FineTuneSample, ProposedBatch, StepRecord
from . import COSERVED, SYSTEMS

__all__ = [
    "COSERVED",
    "SYSTEMS",
    "LLMStationAdmission",
    "PredictionLog",
    "ShapeCacheLatency",
    "cache_estimate",
    "llmstation_policy",
    "model_estimate",
    "system_policy",
]


_NAN = math.nan


class PredictionLog:
    """What each admission decision predicted for its step, keyed by step id, for the estimator-error metric.

    A decision observer; the prediction kept is the one the policy *acted on*: the mixed step when it admitted,
    else the inference batch alone (``estimate`` when the decision did not price it)."""

    def __init__(self, estimate: Callable[[ProposedBatch], float]) -> None:
        self._estimate = estimate
        self.predicted: dict[int, tuple[float, int]] = {}  # step id -> (seconds, FT samples admitted)
        self._lock = threading.Lock()

    def __call__(self, batch: ProposedBatch, d: AdmissionDecision) -> None:
        if d.samples and d.predicted_mixed is not None:
            pred = d.predicted_mixed
        elif not batch.is_empty:
            pred = d.predicted_inference if d.predicted_inference == d.predicted_inference else self._estimate(batch)
        else:
            pred = _NAN
        if pred is not None and pred == pred:
            with self._lock:
                self.predicted[batch.step_id] = (float(pred), len(d.samples))

    def pop(self, step_id: int) -> tuple[float, int] | None:
        with self._lock:
            return self.predicted.pop(step_id, None)


def _bucket(x: int) -> int:
    return 0 if x <= 0 else 1 << (int(x) - 1).bit_length()


class ShapeCacheLatency:
    """Step latency looked up by shape: mean observed duration per (decode-batch bucket, new-token bucket),
    buckets rounded up to powers of two, graph and eager observations pooled in one entry.

    Between populated token buckets of the same decode bucket the time is interpolated linearly; beyond the
    largest it is extrapolated from the last two (or proportionally from one). With no entry for the decode
    bucket the nearest populated decode bucket answers. An empty cache answers ``None`` (nothing is admitted)."""

    def __init__(self) -> None:
        self._sum: dict[tuple[int, int], float] = {}
        self._n: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    def observe(self, record: StepRecord) -> None:
        if record.aborted_sample_ids or record.duration_s <= 0:
            return
        key = (_bucket(record.num_decode), _bucket(sum(record.prefill_lengths) + record.finetune_tokens))
        with self._lock:
            self._sum[key] = self._sum.get(key, 0.0) + record.duration_s
            self._n[key] = self._n.get(key, 0) + 1

    def seed(self, records: Iterable[StepRecord]) -> None:
        for r in records:
            self.observe(r)

    def __len__(self) -> int:
        return len(self._n)

    def predict(self, num_decode: int, new_tokens: int) -> float | None:
        with self._lock:
            table = {k: self._sum[k] / self._n[k] for k in self._n}
        if not table:
            return None
        db = _bucket(num_decode)
        dbs = sorted({k[0] for k in table})
        if db not in dbs:
            db = min(dbs, key=lambda b: (abs(math.log2(b + 1) - math.log2(_bucket(num_decode) + 1)), b))
        row = sorted((k[1], v) for k, v in table.items() if k[0] == db)
        xs = [x for x, _ in row]
        tb = _bucket(new_tokens)
        i = bisect.bisect_left(xs, tb)
        if i < len(xs) and xs[i] == tb:
            return row[i][1]
        if 0 < i < len(xs):
            (x0, y0), (x1, y1) = row[i - 1], row[i]
            return y0 + (y1 - y0) * (tb - x0) / (x1 - x0)
        if i == len(xs):  # beyond the largest populated bucket
            if len(row) >= 2:
                (x0, y0), (x1, y1) = row[-2], row[-1]
                return y1 + max(0.0, (y1 - y0) / (x1 - x0)) * (tb - x1)
            x1, y1 = row[-1]
            return y1 * (tb / x1 if x1 else 1.0)
        x1, y1 = row[0]  # below the smallest: never cheaper than proportional
        return y1 * (tb / x1) if x1 else y1


class LLMStationAdmission:
    """LLMStation-style admission (see the module docstring): decode-only steps, shape-cache prices, a static
    TPOT budget."""

    def __init__(self, slo: SLOConfig, *, max_ft_tokens_per_step: int, cache: ShapeCacheLatency) -> None:
        self.slo = slo
        self.max_ft_tokens_per_step = max_ft_tokens_per_step
        self.cache = cache

    def decide(self, batch: ProposedBatch, *, pool: AdmissionPool, buffer_free_tokens: int) -> AdmissionDecision:
        if buffer_free_tokens <= 0:
            return AdmissionDecision.refused(AdmissionReason.BUFFER_FULL)
        if len(pool) == 0:
            return AdmissionDecision.refused(AdmissionReason.POOL_EMPTY)
        if batch.is_empty or batch.has_prefill:
            return AdmissionDecision.refused(AdmissionReason.DECODE_ONLY_STEP)
        bd = batch.num_decode
        inference = self.cache.predict(bd, 0)
        if inference is None:
            return AdmissionDecision.refused(AdmissionReason.NOT_CALIBRATED)
        budget = self.slo.tpot_s
        limit = min(buffer_free_tokens, self.max_ft_tokens_per_step)
        admitted: list[FineTuneSample] = []
        tokens = 0
        mixed = None
        for s in pool.iter_by_length():
            t = tokens + s.num_tokens
            if t > limit:
                break
            price = self.cache.predict(bd, t)
            if price is None or price > budget:
                break
            admitted.append(s)
            tokens, mixed = t, price
        if not admitted:
            return AdmissionDecision((), budget, inference, None, AdmissionReason.SAMPLE_EXCEEDS_BUDGET)
        samples = tuple(admitted)
        pool.claim(samples)
        return AdmissionDecision(samples, budget, inference, mixed, AdmissionReason.ADMITTED)


def llmstation_policy(cache: ShapeCacheLatency, base: AdmissionPolicy | None = None) -> AdmissionPolicy:
    """``base`` (default :meth:`AdmissionPolicy.default`) with the walk replaced by :class:`LLMStationAdmission`
    over ``cache``, bounded by the job's per-step token cap."""

    def rule(core: Admission) -> LLMStationAdmission:
        return LLMStationAdmission(core.slo, max_ft_tokens_per_step=core.max_ft_tokens_per_step, cache=cache)

    return (base or AdmissionPolicy.default()).with_rule(rule)


def system_policy(system: str, cache: ShapeCacheLatency | None = None) -> AdmissionPolicy:
    """The admission policy of the benchmark's co-served ``system`` (``cache``: the llmstation rule's table)."""
    if system == "paper_rule":
        return AdmissionPolicy.paper()
    if system == "idle_only":
        return AdmissionPolicy.idle_only()
    if system == "no_interrupt":
        return AdmissionPolicy.no_interrupt()
    if system == "llmstation":
        if cache is None:
            raise ValueError("the llmstation policy needs its ShapeCacheLatency")
        return llmstation_policy(cache)
    return AdmissionPolicy.default()


def cache_estimate(cache: ShapeCacheLatency) -> Callable[[ProposedBatch], float]:
    """The shape cache's price of an inference batch (NaN while it has no entry)."""

    def estimate(batch: ProposedBatch) -> float:
        pred = cache.predict(batch.num_decode, sum(batch.prefill_lengths))
        return _NAN if pred is None else pred

    return estimate


def model_estimate(model: LatencyModel) -> Callable[[ProposedBatch], float]:
    """The latency model's price of an inference batch in its own mode (NaN when the model cannot price it)."""

    def estimate(batch: ProposedBatch) -> float:
        try:
            return model.predict_batch(batch)
        except LookupError:
            return _NAN

    return estimate

