"""Broken host: ``shutdown()`` leaves the engine's stats thread (non-daemon) running.

Rule (driver.py, HostDriver.shutdown): "It never leaves a process or a non-daemon thread the host started running:
the process that owns the host must be able to exit once it returned."

Bug: the engine starts a non-daemon stats/heartbeat thread (the pattern of engine metrics loggers and KV-offload
flushers) and the adapter's ``shutdown`` only clears the scheduler; the thread is stopped from ``__del__``, which
never runs while the thread holds a reference to the host. It ends by itself only after 20 s without engine
activity (an idle timeout), so the owning process hangs that long after ``shutdown()`` instead of exiting.

Trigger: every host, at ``shutdown()``.
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
import threading


IDLE_EXIT_S = 20.0


class Host(ReferenceHost):
    def __init__(self, config) -> None:
        super().__init__(config)
        self._stats_stop = threading.Event()
        self._stats_last = time.monotonic()
        self._stats = threading.Thread(target=self._poll_stats, name="engine-stats", daemon=False)  # BUG: non-daemon
        self._stats.start()

    def _poll_stats(self) -> None:
        seen = None
        while not self._stats_stop.wait(0.2):
            now = (len(self._waiting), len(self._running))
            if now != seen:
                seen, self._stats_last = now, time.monotonic()
            elif time.monotonic() - self._stats_last > IDLE_EXIT_S:
                return

    def __del__(self) -> None:  # never reached while the thread runs (it references the host)
        self._stats_stop.set()
