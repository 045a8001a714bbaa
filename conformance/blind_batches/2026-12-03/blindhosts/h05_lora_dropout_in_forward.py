"""h05: the fine-tuning adapter's LoRA dropout is applied in the serving forward.

Rule (hooks.py, HostHooks.set_finetune_adapter): "Fine-tuning rows of later steps must use exactly these weights
(the training path is only exact if the forward sees the current adapter)."; ActivationSink.layer_input: the input
of each decoder layer (what the model with these weights computes).

Bug: the adapter builds its LoRA layer from the state's config the way PEFT's ``LoraLayer`` does, including
``nn.Dropout(lora_dropout)``, and never puts it in eval mode: the LoRA branch's input is dropped out (and rescaled)
at random in every forward, so captured layer inputs from layer 1 on are not the adapter's.
Trigger: a job with ``lora_dropout > 0`` (0.05 and 0.1 are the usual values).
"""
import torch.nn.functional as F

from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _to_lora(self, state):
        lora = super()._to_lora(state)
        lora.dropout = float(state.config.lora_dropout)
        return lora

    def _linear(self, x, module, layer, name, groups):
        out = module(x)
        for adapter, index in groups.items():
            lora = self._adapters[adapter]
            pair = lora.pairs.get((layer, name))
            if pair is None:
                continue
            a, b = pair
            xi = x.index_select(0, index)
            p = getattr(lora, "dropout", 0.0)
            if p:
                xi = F.dropout(xi, p, training=True)  # the LoRA module was never switched to eval()
            out.index_add_(0, index, (xi @ a.T @ b.T) * lora.scaling)
        return out
