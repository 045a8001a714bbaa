"""p08: a request on client adapter 'cl' keeps decoding while a base request's prompt is prefilled beside it: its tokens
equal PEFT greedy argmax with 'cl'."""
from _common import *

cl = adapter_dir("cl", seed=3)
pa, pb = prompt(12, 5), prompt(9, 6)
truth = hf_greedy(pa, 6, adapter=cl)


def check(cls):
    h = make(cls, client_adapters={"cl": str(cl)})
    h.submit(ClientRequest("a", pa, 6, adapter="cl"))
    outs = h.step()
    h.submit(ClientRequest("b", pb, 3))
    outs += drain(h)
    got = [list(o.token_ids) for o in outs if o.request_id == "a"][0]
    return got == truth, f"a on 'cl' decoding when b (base) is prefilled in step 1: truth {truth}; got {got}"


run("p08", check, host_module("08").Host)
