"""h18: capture_activation(None) does not remove the activation sink.

Rule (hooks.py, HostHooks.capture_activation): "Install (or remove) the activation sink; the host then feeds it per
the :class:`ActivationSink` contract."

Bug: the sink lives in the worker process; the adapter broadcasts it there with ``if sink: broadcast(sink)``, so a
``None`` is never sent and the worker keeps feeding the old sink (begin_step / layer_input / end_step /
should_abort of every later fine-tuning step).

Trigger: capture_activation(None) (the core tearing capture down, e.g. a job that stops) followed by any step with
fine-tuning rows.
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401


class Host(ReferenceHost):
    def capture_activation(self, sink) -> None:
        if sink is not None:  # BUG: None is never broadcast to the worker; the old sink stays installed
            self._activation_sink = sink
