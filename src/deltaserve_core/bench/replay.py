"""Replaying arrivals against a host in real time (:func:`replay`, the demo's driver loop) and recording every
step it ran (:class:`_StepRecorder`)."""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .metrics import RequestResult, StepSample

__all__ = ["replay"]


class _StepRecorder:
    """StepSink tee: forwards every record to the co-server (if any) and keeps what the metrics need."""

    def __init__(self, start: float, forward: Callable[[Any], None] | None = None, predictions: Any = None,
                 observers: Sequence[Callable[[Any], None]] = (),
                 reasons: Callable[[int], str | None] | None = None) -> None:
        self.start = start
        self.forward = forward
        self.predictions = predictions
        self.observers = observers
        self.reasons = reasons  # CoServer.step_reason: why admission gave the step the rows it did
        self.steps: list[StepSample] = []

    def __call__(self, record: Any) -> None:
        if self.forward is not None:
            self.forward(record)
        if record.synthetic:
            if self.reasons is not None:
                self.reasons(record.step_id)  # answered once: drop it so the co-server's table stays small
            return
        reason = (self.reasons(record.step_id) or "") if self.reasons is not None else ""
        for obs in self.observers:
            obs(record)
        pred = math.nan
        if self.predictions is not None:
            got = self.predictions.pop(record.step_id)
            # a prediction counts only for the step it priced (the host may have dropped admitted rows)
            if got is not None and got[1] == len(record.finetune_sample_ids) + len(record.aborted_sample_ids):
                pred = got[0] if not record.aborted_sample_ids else math.nan
        self.steps.append(StepSample(record.start_time - self.start, record.duration_s,
                                     bool(record.prefill_lengths) or record.num_decode > 0,
                                     record.finetune_tokens, record.mode.value, pred,
                                     sum(record.prefill_lengths), record.num_decode,
                                     len(record.finetune_sample_ids), reason))


def replay(host: Any, arrivals: Sequence[tuple[float, Any]], *, duration_s: float, coserver: Any = None,
           notify: Callable[[str, float], None] | None = None, on_tick: Callable[[float], None] | None = None,
           start: float | None = None, drain_timeout_s: float = 600.0
           ) -> tuple[dict[str, Any], float, list[tuple[float, int]]]:
    """Serve ``arrivals`` ((seconds, ClientRequest), sorted) in real time; with ``coserver``, offer idle steps.

    Returns (outputs by request id, start time, FT optimizer steps as (seconds, tokens)). Runs until every
    request finished and ``duration_s`` passed (so fine-tuning gets the same tail of trace time everywhere)."""
    start = time.monotonic() if start is None else start
    stop = threading.Event()
    if notify is not None:
        def arrivals_clock() -> None:
            for t, req in arrivals:
                delay = start + t - time.monotonic()
                if delay > 0 and stop.wait(delay):
                    return
                notify(req.request_id, time.monotonic())

        clock = threading.Thread(target=arrivals_clock, name="bench-arrivals", daemon=True)
        clock.start()
    pending = list(arrivals)
    pending.reverse()  # pop() from the end: O(1)
    outputs: dict[str, Any] = {}
    ft_steps: list[tuple[float, int]] = []
    trained = coserver.stats.trained_tokens if coserver is not None else 0
    deadline = None
    try:
        while True:
            now = time.monotonic() - start
            while pending and pending[-1][0] <= now:
                host.submit(pending.pop()[1])
            if host.has_unfinished():
                for o in host.step():
                    outputs[o.request_id] = o
            elif not pending and now >= duration_s:
                break
            elif coserver is not None and not coserver.finished:
                if not host.run_idle_step():
                    coserver.poll()
                    time.sleep(0.002)
            else:
                wait = (pending[-1][0] - now) if pending else (duration_s - now)
                time.sleep(min(0.01, max(0.0, wait)))
            if coserver is not None and coserver.stats.trained_tokens != trained:
                ft_steps.append((time.monotonic() - start, coserver.stats.trained_tokens - trained))
                trained = coserver.stats.trained_tokens
            if on_tick is not None:
                on_tick(now)
            if not pending and now >= duration_s:
                deadline = deadline or time.monotonic() + drain_timeout_s
                if time.monotonic() > deadline:
                    raise RuntimeError(f"requests still unfinished {drain_timeout_s:.0f} s after the trace ended; "
                                       "the host cannot keep up with this trace (lower --load or --scale)")
    finally:
        stop.set()
    return outputs, start, ft_steps


def _results(outputs: dict[str, Any], arrivals: Sequence[tuple[float, Any]], start: float) -> list[RequestResult]:
    out = []
    for t, req in arrivals:
        o = outputs[req.request_id]
        out.append(RequestResult(req.request_id, t, len(req.prompt_ids), req.max_tokens,
                                 tuple(x - start for x in o.token_times)))
    return out


class _Progress:
    def __init__(self, enabled: bool, total: float, desc: str) -> None:
        self.bar = None
        self.done = 0
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=max(1, int(math.ceil(total))), desc=desc, unit="s", leave=True, file=sys.stderr,
                            bar_format="{desc:<14} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} s trace time "
                                       "[{elapsed}<{remaining}]{postfix}")

    def tick(self, now: float) -> None:
        if self.bar is not None:
            k = min(self.bar.total, int(now))
            if k > self.done:
                self.bar.update(k - self.done)
                self.done = k

    def close(self, postfix: str = "") -> None:
        if self.bar is not None:
            self.tick(self.bar.total)
            if postfix:
                self.bar.set_postfix_str(postfix)
            self.bar.close()


def _window(reqs: Sequence[RequestResult], duration: float) -> float:
    return max([duration] + [r.token_times_s[-1] for r in reqs])
