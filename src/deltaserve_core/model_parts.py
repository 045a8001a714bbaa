"""What the backward and the reference trainers need to know about a transformers causal LM.

:func:`decoder_parts` finds the decoder, its layer list, the final norm and the output head; :func:`pack_groups`
groups samples into packed sequences; :func:`transformers_packs` says whether the installed transformers keeps
packed samples apart; :func:`attention_without_cudnn` picks SDPA kernels for packed units. Used by
:mod:`deltaserve_core.lora_backward`, :mod:`deltaserve_core.peft_steps`, the preflight check and the test host
(:mod:`deltaserve_core.testing.capture`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence

import torch
from torch import nn

__all__ = [
    "attention_without_cudnn",
    "decoder_parts",
    "pack_groups",
    "transformers_packs",
]


def decoder_parts(model: nn.Module) -> tuple[nn.Module, nn.ModuleList, nn.Module, nn.Module, str]:
    """``(decoder, layers, final_norm, lm_head, layers_path)`` of a transformers causal LM.

    ``layers_path`` is the dotted path of the layer list inside ``model`` (``"model.layers"`` for Llama-style
    families), which is how PEFT keys name the adapted modules.
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    norm = getattr(decoder, "norm", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or not isinstance(layers, nn.ModuleList) or norm is None or head is None:
        raise NotImplementedError(
            f"{type(model).__name__} does not look like a decoder-only causal LM with `.layers`, a final `.norm` "
            "and an output head; DeltaServe's backward supports Llama-style families (Llama, Mistral, SmolLM2, Qwen2, Qwen3)"
        )
    cfg = getattr(model, "config", None)
    for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        value = getattr(cfg, attr, None)
        if value not in (None, 1, 1.0):
            raise NotImplementedError(
                f"{type(model).__name__} post-processes logits ({attr}={value}); the backward's loss head does not "
                "implement that yet"
            )
    path = next((name for name, mod in model.named_modules() if mod is layers), None)
    if path is None:
        raise NotImplementedError(f"could not locate the decoder layer list inside {type(model).__name__}")
    return decoder, layers, norm, head, path


def pack_groups(lengths: Sequence[int], limit: int) -> list[list[int]]:
    """Indices of sequences of ``lengths`` grouped greedily, in order, into groups of at most ``limit`` tokens.

    A sequence longer than ``limit`` is a group of its own; ``limit <= 0`` puts every sequence in its own group.
    """
    groups: list[list[int]] = []
    size = 0
    for i, n in enumerate(lengths):
        if not groups or limit <= 0 or size + n > limit:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += n
    return groups


def attention_without_cudnn(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """SDPA without its cuDNN backend. cuDNN builds an execution plan per new sequence length (far slower than the
    layer itself, docs/benchmarks.md), and packed units have a new length almost every batch; flash / memory-efficient attention have no such cost. Same math, other kernels."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


@functools.cache
def transformers_packs() -> bool:
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:
        return False
    return True
