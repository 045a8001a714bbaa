"""p15: fine-tuning rows use exactly the adapter on a 12-layer model."""
from _common import *  # noqa: F401,F403

H = host_module("15").Host
SMP = sample(1, 16)


def check(cls):
    st = ft_state(seed=FT_ADAPTER_SEED, num_layers=12)
    h, ic, sk, rec, ran = idle_capture(cls, [SMP], state=st, num_layers=12)
    bad = capture_problems(h, sk, [SMP])
    return ran and not bad, f"12-layer model, FT-only step ran={ran}; captures vs PEFT: {bad[:4] or 'all match'}{' ...' if len(bad) > 4 else ''} ({len(bad)} wrong)"


run("p15", check, H)
