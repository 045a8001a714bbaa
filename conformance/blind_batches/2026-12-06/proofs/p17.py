"""p17: a published name keeps serving the published weights after the caller changes its tensors."""
from _common import *  # noqa: F401,F403

H = host_module("17").Host
PR = prompt(10, 5)


def check(cls):
    h = make(cls)
    st = ft_state(seed=FT_ADAPTER_SEED, version=3)
    name = h.publish_adapter(st)
    truth = hf_greedy(PR, 6, adapter=adapter_dir("ft", seed=FT_ADAPTER_SEED))
    before = list(h.generate([ClientRequest("a", PR, 6, adapter=name)])[0].token_ids)
    for key, t in st.tensors.items():
        if "lora_B" in key:
            t.zero_()  # the caller recycles its snapshot buffers
    after = list(h.generate([ClientRequest("b", PR, 6, adapter=name)])[0].token_ids)
    return (before == truth and after == truth,
            f"{name}: truth (PEFT, published weights) {truth}; served before {before}, after the caller zeroed its "
            f"lora_B tensors {after} (base model gives {hf_greedy(PR, 6)})")


run("p17", check, H)
