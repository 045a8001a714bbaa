"""p08: a version published for a job adapter named 'tiny.v2-sql' is servable under exactly the returned name,
with the published weights (truth: transformers + PEFT greedy decoding)."""
from _common import FT_ADAPTER_SEED, ClientRequest, adapter_dir, ft_state, hf_greedy, host_module, make, prompt, run
from deltaserve_core.adapter_state import LoraAdapterState

st = ft_state(seed=FT_ADAPTER_SEED)
PUB = LoraAdapterState("tiny.v2-sql", 3, st.config, dict(st.tensors), st.base_model_path)
P, N = prompt(6, 31), 5
TRUTH = hf_greedy(P, N, adapter_dir("ft", seed=FT_ADAPTER_SEED))


def check(cls):
    h = make(cls)
    name = h.publish_adapter(PUB)
    try:
        out = h.generate([ClientRequest("r", P, N, adapter=name)])[0]
    except Exception as e:  # noqa: BLE001
        return False, f"request for returned name {name!r} refused: {type(e).__name__}: {e}"
    got = list(out.token_ids)
    return got == TRUTH, f"{name!r}: got {got}, truth {TRUTH}"


run("p08", check, host_module("08").Host)
