"""p17: after set_finetune_adapter, a client adapter's requests still get that adapter's greedy output (PEFT)."""
from _common import *  # noqa: F403

CLIENT = adapter_dir("client", seed=3)


def check(cls):
    h = make(cls, client_adapters={"c": str(CLIENT)})
    h.set_finetune_adapter(ft_state())
    p = prompt(8, 1)
    out = h.generate([ClientRequest("a", p, 4, adapter="c")])[0]
    truth, base = hf_greedy(p, 4, CLIENT), hf_greedy(p, 4)
    return list(out.token_ids) == truth, f"got {list(out.token_ids)}, PEFT truth {truth} (base model: {base})"


run("p17", check, host_module("17").Host)
