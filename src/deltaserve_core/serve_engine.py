"""The engine side of ``deltaserve serve``: one thread owns the host and the controller.

Hosts are not thread-safe (vLLM's ``submit`` may not run while ``step`` does), so :class:`EngineLoop` makes every
call into the host and the :class:`~deltaserve_core.coserve.CoServer` on the thread that runs :meth:`EngineLoop.run`.
Its loop: take new requests from a thread-safe inbox and ``host.submit`` them; ``host.step()`` while clients have
work; otherwise ``host.run_idle_step()``, so the job fine-tunes in idle time; ``co.poll()`` for housekeeping.
The HTTP threads (:mod:`.serve_http`) only hand requests and reads to it and wait for the answers.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EngineLoop", "InferenceStats", "ShuttingDown"]

log = logging.getLogger("deltaserve.serve")


@dataclass
class _Pending:
    """One client request on its way through the engine thread; the HTTP thread waits on ``done``."""

    request: Any  # ClientRequest
    done: threading.Event = field(default_factory=threading.Event)
    output: Any = None  # ClientOutput
    error: BaseException | None = None
    status: int = 400  # HTTP status when ``error`` is set


@dataclass
class _Call:
    """A function the engine thread runs between steps (reads of controller state)."""

    fn: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class ShuttingDown(RuntimeError):
    """The server no longer accepts requests."""


@dataclass
class InferenceStats:
    """Running SLO attainment of answered requests (same definitions as ``deltaserve demo``)."""

    ttft_s: float
    tpot_s: float
    requests: int = 0
    ttft_ok: int = 0
    tpot_ok: int = 0
    both_ok: int = 0
    sum_ttft_s: float = 0.0
    max_tpot_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    refused: int = 0

    def add(self, output: Any, prompt_tokens: int) -> None:
        worst = max(output.tpots_s, default=0.0)
        a, b = output.ttft_s <= self.ttft_s, worst <= self.tpot_s
        self.requests += 1
        self.ttft_ok += a
        self.tpot_ok += b
        self.both_ok += a and b
        self.sum_ttft_s += output.ttft_s
        self.max_tpot_s = max(self.max_tpot_s, worst)
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += len(output.token_ids)

    def as_dict(self) -> dict[str, Any]:
        n = self.requests
        frac = (lambda k: k / n) if n else (lambda k: None)
        return {"requests": n, "slo_attainment": frac(self.both_ok), "ttft_attainment": frac(self.ttft_ok),
                "tpot_attainment": frac(self.tpot_ok), "mean_ttft_s": self.sum_ttft_s / n if n else None,
                "max_tpot_s": self.max_tpot_s, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "refused": self.refused,
                "slo": {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s}}


class EngineLoop:
    """The serve loop. Every host and controller call happens in :meth:`run`, on one thread.

    Other threads only use :meth:`submit`, :meth:`call`, :meth:`begin_stop` and :meth:`stop_now`.
    """

    def __init__(self, host: Any, coserver: Any, *, log_every_s: float = 10.0) -> None:
        self.host = host
        self.co = coserver
        self.stats = InferenceStats(coserver.job.slo.ttft_s, coserver.job.slo.tpot_s)
        self.log_every_s = log_every_s
        #: snapshot for /v1/models (a resumed job has published already), replaced (never mutated) by the loop
        self.published: tuple[str, ...] = tuple(coserver.stats.published)
        self.error: BaseException | None = None
        self._inbox: queue.Queue[_Pending | _Call] = queue.Queue()
        self._live: dict[str, _Pending] = {}
        self._lock = threading.Lock()  # accepting flag + inbox puts vs. the loop's decision to exit
        self._accepting = True
        self._abandon = False
        self._exited = False
        self._last_log = time.monotonic()
        self._logged_requests = 0
        from .metrics import JobMetrics

        self.metrics = JobMetrics(coserver)

    # -- other threads ------------------------------------------------------------------------------------

    def submit(self, request: Any) -> _Pending:
        pending = _Pending(request)
        with self._lock:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down")
            self._inbox.put(pending)
        return pending

    def call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        c = _Call(fn)
        with self._lock:
            if self._exited:
                raise ShuttingDown("the engine loop has stopped")
            self._inbox.put(c)
        if not c.done.wait(timeout):
            raise TimeoutError("the engine thread did not answer in time")
        if c.error is not None:
            raise c.error
        return c.result

    def begin_stop(self) -> None:
        """Refuse new requests; the loop exits once every accepted one is answered."""
        with self._lock:
            self._accepting = False
        self._inbox.put(_Call(lambda: None))  # wake the loop

    def stop_now(self) -> None:
        """Abandon in-flight requests too (a second signal)."""
        self._abandon = True
        self.begin_stop()

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def exited(self) -> bool:
        return self._exited

    # -- engine thread --------------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # reported to every waiter and to main
            log.exception("engine loop failed")
            self.error = exc
            self._fail_all(RuntimeError(f"the engine failed: {exc}"), 500)
        finally:
            with self._lock:
                self._accepting = False
                self._exited = True
            self._fail_all(ShuttingDown("the server is shutting down"), 503)

    def _loop(self) -> None:
        host, co = self.host, self.co
        while True:
            self._drain()
            if self._abandon:
                self._fail_all(ShuttingDown("the server shut down before this request finished"), 503)
                return
            if not self._accepting:
                with self._lock:
                    if self._inbox.empty() and not self._live:
                        return
            if host.has_unfinished():
                for out in host.step():
                    self._deliver(out)
            elif self._accepting and not co.finished and host.run_idle_step():
                pass  # a fine-tuning-only step ran in idle time
            else:
                co.poll()
                self._wait(0.003 if self._accepting and not co.finished else 0.05)
            if co.stats.published[-1:] != list(self.published[-1:]):  # pruning keeps the count constant
                self.published = tuple(co.stats.published)
            self._maybe_log()

    def _wait(self, timeout: float) -> None:
        try:
            item = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return
        self._handle(item)

    def _drain(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._handle(item)

    def _handle(self, item: _Pending | _Call) -> None:
        if isinstance(item, _Call):
            try:
                item.result = item.fn()
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                item.error = exc
            item.done.set()
            return
        rid = item.request.request_id
        try:
            self.host.submit(item.request)
        except ValueError as exc:  # unknown adapter, prompt too long for the engine, ...
            self.stats.refused += 1
            item.error, item.status = exc, 400
            item.done.set()
            return
        except Exception as exc:  # this request fails, the others keep being served
            log.exception("host.submit failed for %s", rid)
            item.error, item.status = exc, 500
            item.done.set()
            return
        self._live[rid] = item

    def _deliver(self, output: Any) -> None:
        item = self._live.pop(output.request_id, None)
        if item is None:
            return
        self.stats.add(output, len(item.request.prompt_ids))
        item.output = output
        item.done.set()

    def _fail_all(self, exc: BaseException, status: int) -> None:
        items = list(self._live.values())
        self._live.clear()
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for item in items:
            if isinstance(item, _Call):
                item.error = exc
            else:
                item.error, item.status = exc, status
            item.done.set()

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_log < self.log_every_s or self.stats.requests == self._logged_requests:
            return
        self._last_log, self._logged_requests = now, self.stats.requests
        s = self.stats.as_dict()
        log.info("inference: %d requests answered, SLO attainment %.1f%% (TTFT %.1f%%, TPOT %.1f%%), "
                 "mean TTFT %.3f s, max TPOT %.3f s, %d in flight", s["requests"], s["slo_attainment"] * 100,
                 s["ttft_attainment"] * 100, s["tpot_attainment"] * 100, s["mean_ttft_s"], s["max_tpot_s"],
                 len(self._live))

    def metrics_text(self) -> tuple[bytes, str]:
        """``GET /metrics``: the job's Prometheus metrics (:mod:`.metrics`) and their content type. Any thread."""
        from .metrics import SnapshotCollector, render_text

        return render_text(SnapshotCollector(lambda: [(self.metrics.labels, self.metrics.sample())]))

    def status(self) -> dict[str, Any]:
        """Job and inference progress (runs on the engine thread, through :meth:`call`)."""
        co = self.co
        ft = co.stats.as_dict()
        losses = ft.pop("losses")
        ft["recent_losses"] = losses[-20:]
        return {"adapter_name": co.job.adapter_name, "finished": co.finished, "finetune": ft,
                "pool": co.pool.progress(), "inference": self.stats.as_dict(), "in_flight": len(self._live),
                "estimator_mape": ft["estimator_mape"], "published": list(co.stats.published),
                "accepting": self._accepting}
