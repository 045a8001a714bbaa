"""p06: LoRA offsets summed over adapter rows only. Truth: HF / PEFT greedy decoding per request."""
from _common import *

CL = adapter_dir("cl", seed=3)
A = req("a", 12, 61, 6)  # base model
B = req("b", 10, 62, 6, adapter="cl")
TRUTH = {"a": hf_greedy(A.prompt_ids, 6), "b": hf_greedy(B.prompt_ids, 6, adapter=CL)}


def check(cls):
    h = make(cls, client_adapters={"cl": str(CL)})
    outs = h.generate([A, B])
    got = {o.request_id: list(o.token_ids) for o in outs}
    wrong = [(k, got.get(k), TRUTH[k]) for k in TRUTH if got.get(k) != TRUTH[k]]
    return not wrong, f"a (base, prompt 12) and b ('cl', prompt 10) in one step; wrong (id, got, truth): {wrong}"


run("p06", check, host_module("06").Host)
