"""run_profile_step runs the shape ``repeats`` times (warm-up runs first) and records only the last forward.

Rule: hooks.py, HostHooks.report_step_time: "exactly one :class:`StepRecord` per executed step" / HostHooks.run_profile_step:
"Execute one synthetic step of ``shape`` through the host's normal path and return its record."

Bug: the profile path treats ``ProfileShape.repeats`` as warm-up iterations (vLLM's profile / capture loops run a
dummy batch several times and keep the last): the extra forwards run with the step sink muted and draw step ids that
never get a record. Shapes with repeats 1 are exact.
Trigger: any calibration shape with repeats > 1.
"""
from __future__ import annotations

import dataclasses  # noqa: F401
import math  # noqa: F401
import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key  # noqa: F401
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter, run_to_completion, take_kept  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.hostkit import profile_seed, published_name  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _as_list, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import (  # noqa: F401
    ExecutionMode,
    FineTuneSample,
    ModelSpec,
    ProposedBatch,
    RequestSLO,
    ScheduledRequest,
    StepRecord,
)


class Host(ReferenceHost):
    """profile_repeats_unrecorded: see the module docstring."""

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        gen = torch.Generator().manual_seed(profile_seed(shape))
        vocab = self.model.config.vocab_size
        rows: list[_Row] = []
        pos = 0
        for n in shape.prefill_lengths:
            rows.append(_Row(pos, n, None))
            pos += n
        for _ in range(shape.num_decode):
            kv = [(torch.randn(self.num_kv_heads, shape.decode_context, self.head_dim, dtype=self.dtype,
                               device=self.device, generator=None),) * 2 for _ in range(len(self._layers))]
            rows.append(_Row(pos, 1, None, past=shape.decode_context, fake_kv=kv))  # type: ignore[arg-type]
            pos += 1
        for i, n in enumerate(shape.finetune_lengths):
            ids = tuple(torch.randint(0, vocab, (n,), generator=gen).tolist())
            rows.append(_Row(pos, n, RESERVED_ADAPTER_NAME if RESERVED_ADAPTER_NAME in self._adapters else None,
                             sample=FineTuneSample(-1 - i, ids, (False,) + (True,) * (n - 1))))
            pos += n
        tokens = torch.randint(0, vocab, (pos,), generator=gen)
        for r in rows:
            if r.sample is not None:
                tokens[r.start:r.start + r.length] = torch.tensor(r.sample.input_ids)
        sink, self._step_sink = self._step_sink, None  # BUG: warm-up repeats run unrecorded
        for _ in range(max(1, shape.repeats) - 1):
            self._execute(next(self._step_ids), rows, tokens, synthetic=True)
        self._step_sink = sink
        record = self._execute(next(self._step_ids), rows, tokens, synthetic=True)
        return record
