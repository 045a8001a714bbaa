"""p02: a published name serves the published weights, also after training moved the slot on."""
from _common import *  # noqa: F403

H = host_module("02").Host


def check(cls):
    h = make(cls)
    install(h)
    v1 = ft_state(seed=7, version=1)
    h.set_finetune_adapter(v1)
    name = h.publish_adapter(v1)
    h.set_finetune_adapter(ft_state(seed=8, version=2))
    p = prompt(9, 21)
    out = list(h.generate([ClientRequest("r", p, 6, adapter=name)])[0].token_ids)
    truth = hf_greedy(p, 6, adapter_dir("ft", seed=7))
    return out == truth, (f"published {name!r} (v1), then set_finetune_adapter(v2): got {out}, "
                          f"truth (PEFT, v1 weights) {truth}")


run("p02", check, H)
