"""How much of the paper's latency budget Δ admission may actually fill: a measured margin, not a guess.

Algorithm 1 fills a step with fine-tuning rows until the *predicted* step reaches Δ. Two things the paper's rule
leaves out decide whether the *measured* token gap then meets the SLO:

* **estimator error on the steps admission filled.** A step filled to Δ exactly misses whenever the model
  under-predicts it, and each such step breaks the TPOT of every decode in it. The error that matters is the
  error on the steps admission builds -- inference *with* fine-tuning rows -- not the average error: on
  vLLM-CPU those are under-predicted while fine-tuning-only steps are over-predicted, and a factor pooled over
  both (the previous rule: the 0.9 quantile over all fine-tuning-carrying steps) let many mixed steps overrun
  TPOT (``docs/benchmarks.md``).
* **the host's time between steps.** A decode's token gap is the step *plus* what the host does between two
  steps (output processing, scheduling, the core's own bookkeeping), which the step record does not contain.

:class:`SLOMargin` measures both online from the step records and turns them into the two numbers
:class:`~deltaserve_core.admission.Admission` applies to steps with inference: it holds them to
``(Δ − overhead_s) / factor``. ``factor`` is an upper quantile (default: the maximum) of measured ÷ predicted
over the last ``window`` mixed steps. Until ``min_samples`` of them ran, it is the largest of: the calibration's
own p95 error (:meth:`seed`), the mixed steps measured so far, and *proxy* steps -- fine-tuning-only steps and
eager steps with inference only, priced by the same model in the mode every mixed step runs in. The proxies count
from the first one, because the first mixed steps are the ones at risk: on a GPU, eager steps ran well over their
prediction while the backward trained beside inference, further over than the calibration's prior said, and the
first mixed steps admitted overran TPOT although the proxy steps before them had already shown the gap.

After that the proxies still count as a *drift* signal: the factor is never below the median measured ÷ predicted
of the last ``drift_window`` proxy steps. Mixed steps are rare next to inference steps, so a machine that slows down
as a whole (other load, a co-tenant, thermal limits) shows in the proxies first: on vLLM-CPU the proxies' median
rose, then the next mixed step ran above the window's maximum and overran TPOT. A median, not a maximum, because
single proxy steps are short and jitter.

Before ``min_samples`` mixed steps ran, the factor is at least ``warmup_factor`` (default: ``max_factor``, 2):
the first mixed steps are held to half the budget whatever the proxies say. On vLLM-CPU the first mixed steps
ran over their prediction while every proxy before them sat near 1, and overran TPOT. Four half-size mixed steps
cost little fine-tuning and measure the real ratio.

Why a window of 128 mixed steps: the next of n exchangeable ratios exceeds their maximum with probability
1/(n+1), so a 32-step window lets ~3 % of mixed steps overrun whatever the margin, one or two per 20 s CPU run --
which is what the runs showed. 128 makes that ~0.8 %; the cost is that one slow step holds the factor up for
longer.

``overhead_s`` is the same quantile as ``factor`` of the idle time between a step with inference and the next step
that continues its decodes, less any host work the controller itself ran in that gap (:meth:`discount_gap`): an
adapter install is priced on its own, and counting it again as overhead (the window's maximum) held every later
step to a budget short by the install's cost, so the next install never fitted either.

``inference_factor`` prices host work that lengthens a step *without* fine-tuning rows (installing an adapter
version between two steps): the same quantile of measured ÷ predicted over the last ``window`` inference-only steps,
in whatever mode they ran, floored at 1 and at the calibration's prior until ``min_samples`` of them ran. The
mixed-step factor, and its warm-up above all, does not apply there: a step with no fine-tuning rows is not the step
the model mispredicts, and using the warm-up factor of 2 for it meant that under continuous load no step's spare
time ever covered an install, admission waited for the install, no mixed step ever ran, and the warm-up never ended.

Fine-tuning-only steps are not held by the margin: no decode waits on them, and a client that arrives during
one interrupts it at the next layer boundary (hosts with ``supports_abort``) or waits at most the
fine-tuning-only budget.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque

from .types import ExecutionMode, StepRecord

__all__ = ["SLOMargin"]


def _quantile(values: deque[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class SLOMargin:
    """Online margin for admission: estimator-error factor and inter-step overhead (see the module docs).

    ``quantile`` in (0.5, 1] (1 = the maximum over the window); ``max_factor`` bounds the factor so one
    pathological step cannot switch fine-tuning off for a whole window; ``drift_window`` proxy steps give the
    drift floor (0 turns it off); ``warmup_factor`` (default ``max_factor``) is the least factor before
    ``min_samples`` mixed steps ran.
    """

    def __init__(self, *, quantile: float = 1.0, window: int = 128, min_samples: int = 4,
                 max_factor: float = 2.0, drift_window: int = 16, warmup_factor: float | None = None) -> None:
        if not 0.5 < quantile <= 1.0:
            raise ValueError(f"SLOMargin quantile must be in (0.5, 1], got {quantile!r} (1 = the window's maximum)")
        if window < 1 or min_samples < 1 or min_samples > window:
            raise ValueError(f"SLOMargin needs 1 <= min_samples <= window, got min_samples={min_samples}, "
                             f"window={window}")
        if not max_factor >= 1.0:
            raise ValueError(f"SLOMargin max_factor must be >= 1, got {max_factor!r}")
        self.warmup_factor = max_factor if warmup_factor is None else float(warmup_factor)
        if not 1.0 <= self.warmup_factor <= max_factor:
            raise ValueError(f"SLOMargin warmup_factor must be in [1, max_factor={max_factor}], got {warmup_factor!r}")
        if drift_window < 0:
            raise ValueError(f"SLOMargin drift_window must be >= 0 (0: no drift floor), got {drift_window!r}")
        self.quantile = quantile
        self.min_samples = min_samples
        self.max_factor = max_factor
        self._mixed: deque[float] = deque(maxlen=window)
        self._proxy: deque[float] = deque(maxlen=max(window, drift_window))  # its tail is the drift window
        self.drift_window = drift_window
        self._gaps: deque[float] = deque(maxlen=2 * window)
        self._inference: deque[float] = deque(maxlen=window)
        self._prior = 1.0
        self._last_end: float | None = None  # end of the previous step, if it had inference
        self._discount = 0.0
        self.factor = 1.0
        self.inference_factor = 1.0
        self.overhead_s = 0.0
        self._update()

    def seed(self, p95_relative_error: float | None) -> None:
        """Start from the calibration's p95 relative error (a fraction) until co-served steps are measured."""
        if p95_relative_error is not None and math.isfinite(p95_relative_error) and p95_relative_error > 0:
            self._prior = min(self.max_factor, 1.0 + p95_relative_error)
            self._update()

    def observe(self, record: StepRecord, predicted_s: float | None) -> None:
        """Account one executed, non-synthetic step; ``predicted_s`` is admission's price for it (None: unpriced)."""
        inference = bool(record.prefill_lengths) or record.num_decode > 0
        if self._last_end is not None and record.num_decode > 0:
            # the decodes in this step got their previous token from the step that ended at _last_end
            gap = record.start_time - self._last_end - self._discount
            if gap >= 0:
                self._gaps.append(gap)
        self._discount = 0.0
        self._last_end = record.start_time + record.duration_s if inference else None
        if (not record.aborted_sample_ids and predicted_s is not None and predicted_s > 0
                and record.duration_s > 0):
            ratio = record.duration_s / predicted_s
            if record.finetune_sample_ids and inference:
                self._mixed.append(ratio)
            elif record.finetune_sample_ids or (inference and record.mode is ExecutionMode.EAGER):
                self._proxy.append(ratio)
            if inference and not record.finetune_sample_ids:
                self._inference.append(ratio)
        self._update()

    def _update(self) -> None:
        if len(self._mixed) >= self.min_samples:
            f = _quantile(self._mixed, self.quantile)
            if 0 < self.drift_window <= len(self._proxy):
                recent = itertools.islice(self._proxy, len(self._proxy) - self.drift_window, None)
                f = max(f, statistics.median_high(recent))
        else:
            f = max(self._prior, self.warmup_factor)
            for pool in (self._mixed, self._proxy):
                if pool:
                    f = max(f, _quantile(pool, self.quantile))
        self.factor = min(self.max_factor, max(1.0, f))
        g = _quantile(self._inference, self.quantile) if self._inference else 1.0
        if len(self._inference) < self.min_samples:
            g = max(g, self._prior)
        self.inference_factor = min(self.max_factor, max(1.0, g))
        self.overhead_s = _quantile(self._gaps, self.quantile) if self._gaps else 0.0

    def discount_gap(self, seconds: float) -> None:
        """The controller ran host work for ``seconds`` before the next step: not host overhead between steps."""
        self._discount += max(0.0, seconds)

    @property
    def mixed_samples(self) -> int:
        """Mixed steps the factor is currently measured on."""
        return len(self._mixed)
