"""p03: two concurrent requests, one on a client LoRA adapter and one on the base model, each get their own
model's greedy output (truth: transformers + PEFT greedy decoding)."""
from _common import ClientRequest, adapter_dir, hf_greedy, host_module, make, prompt, run

A = adapter_dir("client", seed=3)
P1, P2, N = prompt(6, 21), prompt(6, 22), 6
T1, T2 = hf_greedy(P1, N, A), hf_greedy(P2, N, None)
print(f"[p03] truth: r1 (adapter) {T1}, r2 (base) {T2}; r2 under the adapter would be {hf_greedy(P2, N, A)}")


def check(cls):
    h = make(cls, client_adapters={"a": str(A)})
    o1, o2 = h.generate([ClientRequest("r1", P1, N, adapter="a"), ClientRequest("r2", P2, N)])
    g1, g2 = list(o1.token_ids), list(o2.token_ids)
    return (g1 == T1 and g2 == T2), f"r1 {g1} (truth {T1}), r2 {g2} (truth {T2})"


run("p03", check, host_module("03").Host)
