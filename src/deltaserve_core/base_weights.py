"""The base model the backward process trains through: the host's own weights when it lends them
(:class:`~deltaserve_core.hooks.LendsBaseWeights`), else a copy loaded from the model's path."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

from .hooks import HostHooks

__all__ = ["backward_base_model", "model_on_lent_weights"]

log = logging.getLogger("deltaserve.coserve")


def backward_base_model(host: HostHooks, path: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """The base model the backward process trains through: built on the host's own weights when it lends them
    (:class:`~deltaserve_core.hooks.LendsBaseWeights`), else loaded from ``path``. Logs which, and the bytes."""
    from transformers import AutoModelForCausalLM

    lend = getattr(host, "base_weights", None)
    lent = lend() if lend is not None else None
    label = getattr(host, "name", type(host).__name__)
    if lent is None:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        log.info("backward base model: loaded from %s, %.1f MiB (host %r lends no weights)", path,
                 _param_bytes(model) / 2**20, label)
        return model
    model = model_on_lent_weights(path, lent, dtype=dtype, device=device, host=label)
    log.info("backward base model: mapped onto host %r's weights, %.1f MiB shared, 0 loaded", label,
             _param_bytes(model) / 2**20)
    return model


def model_on_lent_weights(path: str, lent: Mapping[str, torch.Tensor], *, dtype: torch.dtype, device: str,
                          host: str = "?") -> torch.nn.Module:
    """``AutoModelForCausalLM`` of ``path`` whose parameters *are* ``lent`` (no parameter memory of its own).

    Raises ``ValueError`` naming what breaks the :class:`~deltaserve_core.hooks.LendsBaseWeights` contract: a
    parameter without a tensor, a name the model does not have, a wrong dtype or device (shapes are checked by
    ``load_state_dict``)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    target = torch.device(device)
    wrong = [f"{n} ({t.dtype}, {t.device})" for n, t in lent.items()
             if t.dtype != dtype or t.device.type != target.type
             or (target.index is not None and t.device.index != target.index)]
    if wrong:
        raise ValueError(f"host {host!r} lends base weights that are not {dtype} on {device}: {', '.join(wrong[:5])}"
                         f"{' ...' if len(wrong) > 5 else ''}")
    # Parameters on the meta device until assigned; buffers real, because rotary inv_freq is computed at
    # construction and is in no checkpoint nor in what a host lends.
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)
    # detach(): new tensor objects on the same storage, so nothing the backward does to its parameters' flags
    # reaches the host's own parameter objects
    result = model.load_state_dict({n: t.detach() for n, t in lent.items()}, strict=False, assign=True)
    if result.unexpected_keys:
        raise ValueError(f"host {host!r} lends weights the model of {path} does not have: "
                         f"{', '.join(sorted(result.unexpected_keys)[:8])}")
    model.tie_weights()  # a tied output head (tie_word_embeddings) becomes the lent embedding, as in from_pretrained
    missing = [n for n, p in model.named_parameters(remove_duplicate=False) if p.is_meta]
    if missing:
        raise ValueError(f"host {host!r} lends no tensor for {len(missing)} parameter(s) of {path}: "
                         f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    return model.to(device).eval()  # moves the buffers; the lent parameters are already there


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
