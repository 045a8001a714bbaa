"""p02: max_finetune_tokens_per_step must be HostConfig.max_batch_tokens (types.py, HostCapabilities)."""
import _common as c


def check(cls):
    h = c.make(cls)
    caps = h.capabilities()
    want = h.config.max_batch_tokens
    return caps.max_finetune_tokens_per_step == want, (
        f"declared max_finetune_tokens_per_step={caps.max_finetune_tokens_per_step}, "
        f"HostConfig.max_batch_tokens={want}")


c.run("p02", check, c.host_module("02").Host)
