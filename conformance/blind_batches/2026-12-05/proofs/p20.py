"""p20: fine-tuning rows of later steps use exactly the weights of the last set_finetune_adapter
(hooks.py, set_finetune_adapter)."""
import _common as c


def check(cls):
    s1, s2 = c.sample(1, 10), c.sample(2, 12)
    h = c.make(cls)
    ic, sk, rec = c.install(h, plan=lambda b, i: [s1] if i == 0 else ([s2] if i == 1 else []))
    h.set_finetune_adapter(c.ft_state(seed=7, version=1))
    ran1 = h.run_idle_step()
    bad1 = c.capture_problems(h, sk, [s1], adapter=c.adapter_dir("ft", seed=7))
    sk2 = c.Sink()
    h.capture_activation(sk2)
    h.set_finetune_adapter(c.ft_state(seed=8, version=2))  # the optimizer step
    ran2 = h.run_idle_step()
    bad2 = c.capture_problems(h, sk2, [s2], adapter=c.adapter_dir("ft", seed=8))
    old = c.capture_problems(h, sk2, [s2], adapter=c.adapter_dir("ft", seed=7))
    ok = ran1 and ran2 and not bad1 and not bad2
    return ok, (f"step 1 on v1: {bad1 or 'matches v1'}; step 2 after set_finetune_adapter(v2): "
                f"{bad2 or 'matches v2'}{' (matches v1 exactly)' if bad2 and not old else ''}")


c.run("p20", check, c.host_module("20").Host)
