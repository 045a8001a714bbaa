"""Broken host: requests stop at EOS although ``ignore_eos=True`` (the default).

Rule (driver.py, ClientRequest): "With ``ignore_eos=False`` it must stop at the first EOS it generates, EOS included as
its last token; with ``ignore_eos=True`` (the default) it runs on to ``max_tokens``."

Bug: the adapter builds the engine's sampling parameters with ``ignore_eos`` only when it is False (``if not
request.ignore_eos: params.stop_token_ids = eos``) and leaves the engine default otherwise; the engine's default
stops at the model's EOS. Every request whose greedy continuation produces EOS is cut there.

Trigger: any default request whose output reaches EOS before ``max_tokens``.
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



class Host(ReferenceHost):
    def _is_done(self, s) -> bool:
        if len(s.output) >= s.request.max_tokens:
            return True
        return bool(s.output) and s.output[-1] in self.eos_ids  # BUG: the engine's default EOS stop, flag ignored
