"""p08: after set_finetune_adapter(new weights), the next fine-tuning step's captures must be PEFT's with the new
adapter (two fine-tuning-only steps with an update between them)."""
from _common import *  # noqa: F403

Host = host_module("08").Host
S1, S2 = sample(1, 10), sample(2, 12)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [S1] if i == 0 else [S2] if i == 1 else [])
    h.set_finetune_adapter(ft_state(seed=7))
    ran1 = h.run_idle_step()
    h.set_finetune_adapter(ft_state(seed=8, version=2))  # the optimizer step
    ran2 = h.run_idle_step()
    sk2 = Sink()
    sk2.events = [e for e in sk.events if e[0] == "layer" and e[3] == 2]
    bad = capture_problems(h, sk2, [S2], adapter=adapter_dir("ft", seed=8))
    return ran1 and ran2 and not bad, (f"step 0 on adapter seed 7 (ran={ran1}), set_finetune_adapter(seed 8), step 1 "
                                       f"(ran={ran2}); sample 2 captures vs PEFT seed 8: {bad or 'exact'}")


run("p08", check, Host)
