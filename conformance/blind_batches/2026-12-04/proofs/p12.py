"""p12: a request on a client adapter finishes on that adapter when a version is published mid-request."""
from _common import *  # noqa: F403

H = host_module("12").Host


def check(cls):
    client = adapter_dir("client", seed=3)
    h = make(cls, client_adapters={"zeta": str(client)})
    install(h)
    p = prompt(8, 41)
    h.submit(ClientRequest("r", p, 8, adapter="zeta"))
    outs = []
    for _ in range(3):
        outs.extend(h.step())
    name = h.publish_adapter(ft_state(seed=7, version=1))
    outs.extend(drain(h))
    got = list(outs[0].token_ids)
    truth = hf_greedy(p, 8, client)
    return got == truth, f"published {name!r} after 3 tokens: got {got}, truth (PEFT on 'zeta') {truth}"


run("p12", check, H)
