"""ModelSpec.dtype is the checkpoint's saved dtype (config.json), not the dtype the engine serves the model in.

Rule: types.py, ModelSpec: "``dtype`` must be the dtype the engine serves the model in (the backward process loads
the base and replays captures in it)."

Bug: the adapter fills dtype from the checkpoint's config (``torch_dtype`` / ``dtype`` of config.json, what an
engine's ``dtype="auto"`` would resolve to) while the engine runs in the dtype it was started with (HostConfig.dtype,
float32 by default). The backward process then loads the base in another dtype than the captures it replays.
Trigger: serving a checkpoint saved in another dtype than the serving one: every bfloat16 Hugging Face checkpoint
served at the default float32 (proof: the tiny Llama saved in bfloat16). The test checkpoint (saved float32, served
float32) is exact.
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
from deltaserve_core.hostkit import published_name  # noqa: F401
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


def _checkpoint_dtype(path, default):
    """The dtype the checkpoint was saved in, from its config.json."""
    import json
    from pathlib import Path

    raw = json.loads((Path(path) / "config.json").read_text())
    return str(raw.get("dtype") or raw.get("torch_dtype") or default)


class Host(ReferenceHost):
    """model_spec_dtype_from_checkpoint: see the module docstring."""

    def model_spec(self) -> ModelSpec:
        cfg = self.model.config
        return ModelSpec(path=str(self.config.model), architecture=type(self.model).__name__,
                         num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
                         dtype=_checkpoint_dtype(self.config.model, self.config.dtype))  # BUG: the checkpoint's dtype
