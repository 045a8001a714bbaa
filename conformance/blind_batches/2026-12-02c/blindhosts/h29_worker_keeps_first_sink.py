"""
h29 - the forward side keeps the first activation sink; a later capture_activation(new) does not reach it.

Rule (hooks.py, HostHooks.capture_activation): "Install (or remove) the activation sink ... A later call replaces
the installed sink, which is never called again." (ActivationSink: "called by the host in the process that runs the
forward pass (possibly another process than the scheduler: the object is pickled there)".)

Bug: the adapter pickles the sink to the worker with ``collective_rpc`` only when the worker has none yet
(``if not worker.has_sink``), to save an RPC per install; a replacement sink stays on the scheduler side while the
worker keeps feeding the first one. Removal (``None``) is sent.

Trigger: a second ``capture_activation(new_sink)`` during the host's life (core restart, job replaced).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def capture_activation(self, sink):
        if sink is None or self._activation_sink is None:
            super().capture_activation(sink)
        # else: the worker already has a sink; no RPC sent
