"""p01: fine-tuning rows must not read the prefix cache: captures of a sample sharing 40 tokens with a served base prompt."""
from _common import *  # noqa: F401,F403

from deltaserve_core.types import FineTuneSample

Base = base_module("_prefix_cache").PrefixCacheHost
H = host_module("01").Host
PROMPT = prompt(48, 11)
SMP = FineTuneSample(1, PROMPT[:40] + prompt(8, 12), (False,) + (True,) * 47)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [SMP] if b.is_empty else [])
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.generate([ClientRequest("sys", PROMPT, 2)])
    ran = h.run_idle_step()
    bad = capture_problems(h, sk, [SMP])
    return ran and not bad, (f"base-model prompt of 48 tokens served, then a 48-token FT sample sharing its first 40 "
                             f"tokens (idle step ran={ran}); captures vs PEFT: {bad[:4] or 'all match'}")


run_with_base("p01", check, Base, H)
