"""Broken host h35: ``should_abort`` keeps being polled on the first activation sink ever installed.

Rule (hooks.py, HostHooks.capture_activation): "Install (or remove) the activation sink ... A later call replaces
the installed sink, which is never called again."
Bug: the worker binds its abort poller once, at attach time (the first sink pickled to the worker); later calls
swap the capture target but the layer-boundary poll still goes to the old sink.
Trigger: capture_activation called a second time with a new sink, then a fine-tuning-only step."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence

import torch

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME, ActivationSink, ReservedAdapterError, ScheduleInterceptor, StepSink
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq
from deltaserve_core.types import (
    ExecutionMode,
    FineTuneSample,
    HostCapabilities,
    ProfileShape,
    ProposedBatch,
    StepRecord,
)

log = logging.getLogger(__name__)


class Host(ReferenceHost):
    """Layer-boundary abort polls go to the first sink after the sink was replaced."""

    name = "blind-h35"

    def capture_activation(self, sink):
        if sink is not None and getattr(self, "_abort_poller", None) is None:
            self._abort_poller = sink  # bound once at attach
        self._activation_sink = sink

    def _execute(self, step_id, rows, tokens, synthetic=False):
        sink, poller = self._activation_sink, getattr(self, "_abort_poller", None)
        if sink is None or poller is None or poller is sink:
            return super()._execute(step_id, rows, tokens, synthetic)

        class _Split:
            def begin_step(self, *a):
                sink.begin_step(*a)

            def layer_input(self, *a):
                sink.layer_input(*a)

            def should_abort(self, step_id):
                return poller.should_abort(step_id)

            def end_step(self, *a):
                sink.end_step(*a)

        self._activation_sink = _Split()
        try:
            return super()._execute(step_id, rows, tokens, synthetic)
        finally:
            self._activation_sink = sink
