"""Reference PEFT trainers: what a user writes with transformers + PEFT, against which the backward is measured.

:func:`plain_peft_step` defines exactness (see :mod:`deltaserve_core.lora_backward`): the exactness tests compare
:class:`~deltaserve_core.lora_backward.LoraBackward` with it. :func:`packed_peft_step` is the same step with
transformers' padding-free packing; the throughput benchmark times both, and the split-pool baseline trains with
the packed one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .model_parts import attention_without_cudnn, pack_groups, transformers_packs
from .types import FineTuneSample

__all__ = ["packed_peft_step", "plain_peft_step"]


def plain_peft_step(peft_model: nn.Module, optimizer: torch.optim.Optimizer,
                    samples: Sequence[FineTuneSample]) -> float:
    """The reference training step that defines exactness (see the module docstring). Returns the batch loss.

    Used by the exactness tests and the throughput benchmark; it is what a user would write with transformers and
    PEFT: per-sample unpadded forward, HF's loss with ``num_items_in_batch``, one AdamW step per batch.
    """
    total_targets = sum(s.num_targets for s in samples)
    device = next(peft_model.parameters()).device
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for s in samples:
        ids = torch.tensor(s.input_ids, dtype=torch.long, device=device)[None]
        labels = ids.clone()
        labels[0, ~torch.tensor(s.loss_mask, device=device)] = -100
        out = peft_model(input_ids=ids, labels=labels, num_items_in_batch=total_targets, use_cache=False)
        out.loss.backward()
        total += float(out.loss.detach())
    optimizer.step()
    return total


def packed_peft_step(peft_model: nn.Module, optimizer: torch.optim.Optimizer, samples: Sequence[FineTuneSample],
                     pack_tokens: int = 2048) -> float:
    """:func:`plain_peft_step` the way a throughput-minded user writes it: transformers' padding-free packing.

    Samples are concatenated into sequences of up to ``pack_tokens`` tokens (whole samples, in order) with
    ``position_ids`` restarting per sample, which transformers turns into a block-diagonal causal mask (what
    ``DataCollatorWithFlattening`` produces); each sample's first label is ``-100`` so no row predicts across a
    boundary. Same loss and gradients as the per-sample loop up to rounding. The split-pool baseline's trainer uses
    it, so the baseline batches as well as DeltaServe's packed backward does.
    """
    if pack_tokens <= 0 or not transformers_packs():  # old transformers would attend across samples
        return plain_peft_step(peft_model, optimizer, samples)
    total_targets = sum(s.num_targets for s in samples)
    device = next(peft_model.parameters()).device
    groups = [[samples[i] for i in g] for g in pack_groups([s.num_tokens for s in samples], pack_tokens)]
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    with attention_without_cudnn(device):  # same reason as in LoraBackward.backward
        for group in groups:
            ids = torch.tensor([t for s in group for t in s.input_ids], dtype=torch.long, device=device)[None]
            pos = torch.tensor([i for s in group for i in range(s.num_tokens)], dtype=torch.long, device=device)[None]
            labels = ids.clone()
            keep = torch.tensor([m and i > 0 for s in group for i, m in enumerate(s.loss_mask)], device=device)
            labels[0, ~keep] = -100
            out = peft_model(input_ids=ids, position_ids=pos, labels=labels, num_items_in_batch=total_targets,
                             use_cache=False)
            out.loss.backward()
            total += float(out.loss.detach())
    optimizer.step()
    return total
