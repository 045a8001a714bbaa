"""p06: a published version of an adapter targeting gate_proj and up_proj must serve its weights."""
from _common import *  # noqa: F403

Host = host_module("06").Host
MLP = adapter_dir("mlp", seed=5, targets=("q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"))
A = req("a", 14, 61, 10)
TRUTH = hf_greedy(A.prompt_ids, 10, adapter=MLP)


def check(cls):
    h = make(cls)
    st = LoraAdapterState.load_pretrained(MLP, name="job")
    name = h.publish_adapter(LoraAdapterState(st.name, 3, st.config, dict(st.tensors), st.base_model_path))
    got = list(h.generate([ClientRequest("a", A.prompt_ids, 10, adapter=name)])[0].token_ids)
    return got == TRUTH, f"'{name}' (q, v, gate, up, down; r 8), prompt 14: truth (PEFT) {TRUTH}; got {got}"


run("p06", check, Host)
