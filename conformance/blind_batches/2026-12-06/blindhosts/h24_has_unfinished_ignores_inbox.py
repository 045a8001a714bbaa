"""Broken host: ``has_unfinished()`` ignores requests still in the engine's input queue.

Rule (driver.py, HostDriver.has_unfinished): "Whether any submitted client request has not finished."

Bug: ``submit`` puts the request on the engine's thread-safe input queue (as vLLM's EngineCore input queue / SGLang's
tokenizer-to-scheduler pipe); the scheduler moves it into its waiting queue at the start of the next step.
``has_unfinished`` asks the scheduler only, so between ``submit`` and the next ``step()`` a submitted request is not
counted: a driver loop ``while host.has_unfinished(): host.step()`` right after ``submit`` never serves it.
(``generate`` and ``run_idle_step`` drain the input queue first and are right.)

Trigger: ``has_unfinished()`` after ``submit()`` and before the next ``step()``.
"""
from __future__ import annotations

import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401
from dataclasses import replace  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.driver import ClientOutput  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import ExecutionMode, FineTuneSample, ProposedBatch, StepRecord  # noqa: F401
from collections import deque



class Host(ReferenceHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        self._inbox: deque = deque()  # the engine's input queue (appends are thread-safe)

    def _enqueue(self, request) -> None:
        now = time.monotonic()
        self._inbox.append(_Seq(request, now))
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)

    def _pull_inbox(self) -> None:
        with self._lock:
            while self._inbox:
                self._waiting.append(self._inbox.popleft())

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)  # BUG: the scheduler's queues only, not the input queue

    def step(self):
        self._pull_inbox()
        return super().step()

    def run_idle_step(self) -> bool:
        self._pull_inbox()
        return super().run_idle_step()

    def generate(self, requests):
        for r in requests:
            self.submit(r)
        self._pull_inbox()
        return self._collect(requests)

    def _collect(self, requests):
        wanted = {r.request_id for r in requests}
        got = {}
        while len(got) < len(wanted):
            self._pull_inbox()
            if not self.has_unfinished():
                raise RuntimeError(f"the engine has no work left but requests {sorted(wanted - set(got))} never finished")
            got.update((o.request_id, o) for o in self.step() if o.request_id in wanted)
        return [got[r.request_id] for r in requests]

    def shutdown(self) -> None:
        self._inbox.clear()
        super().shutdown()
