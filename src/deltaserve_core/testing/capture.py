"""A minimal host for tests and benchmarks: run samples through a transformers model and feed an activation sink.

:func:`capture_forward` is the smallest faithful host capture (see its docstring); it stands in for an engine's
model runner wherever the tests and benchmarks need captured layer inputs without an inference engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..model_parts import decoder_parts
from ..types import FineTuneSample

__all__ = ["ForwardAborted", "capture_forward"]


class ForwardAborted(RuntimeError):
    """Raised inside :func:`capture_forward`'s layer hook to stop an aborted fine-tuning-only step."""


def capture_forward(model: torch.nn.Module, sink: Any, step_id: int, samples: Sequence[FineTuneSample], *,
                    finetune_only: bool = True) -> tuple[list[int], list[int]]:
    """Run ``samples`` through a transformers (optionally PEFT-wrapped) causal LM and feed ``sink`` like a host.

    The smallest faithful host capture: a forward pre-hook on every decoder layer hands the layer's input to
    ``sink.layer_input`` (and, for a fine-tuning-only step, checks ``sink.should_abort`` first, stopping the forward
    at that layer boundary). Samples run one at a time, unpadded. Returns ``(completed, aborted)`` sample ids after
    calling ``sink.end_step``. Used by tests and benchmarks, and as an executable statement of the capture contract
    for host adapters.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = decoder_parts(base)[1]
    current: list[int] = [-1]

    def make_hook(index: int) -> Any:
        def pre_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if finetune_only and sink.should_abort(step_id):
                raise ForwardAborted(f"step {step_id} aborted before layer {index}")
            hidden = args[0] if args else kwargs["hidden_states"]
            sink.layer_input(step_id, index, current[0], hidden[0])
        return pre_hook

    sink.begin_step(step_id, samples)
    handles = [layer.register_forward_pre_hook(make_hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
    device = next(model.parameters()).device
    done: list[int] = []
    aborted: list[int] = []
    try:
        with torch.no_grad():
            for s in samples:
                current[0] = s.sample_id
                # logits only for the last position, as serving engines do (a full-vocabulary head over every row
                # would dwarf a layer and delay the next abort check)
                model(input_ids=torch.tensor(s.input_ids, dtype=torch.long, device=device)[None], use_cache=False,
                      logits_to_keep=1)
                done.append(s.sample_id)
    except ForwardAborted:
        done, aborted = [], [s.sample_id for s in samples]
    finally:
        for h in handles:
            h.remove()
    sink.end_step(step_id, done, aborted)
    return done, aborted
