"""p05: with a job config of lora_dropout=0.1 the captured layer inputs still equal the PEFT model's in eval mode
(the forward that serves and captures is deterministic; dropout belongs to the backward)."""
from _common import FT_ADAPTER_SEED, capture_problems, ft_state, host_module, idle_capture, run, sample
from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.lora_spec import LoraConfigSpec

S = sample(1, 12)
st = ft_state(seed=FT_ADAPTER_SEED)
cfg = LoraConfigSpec(r=st.config.r, lora_alpha=st.config.lora_alpha, target_modules=st.config.target_modules,
                     lora_dropout=0.1)
STATE = LoraAdapterState(st.name, st.version, cfg, dict(st.tensors), st.base_model_path)


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, [S], state=STATE)
    bad = capture_problems(h, sk, [S])
    return not bad and ran, "captures match PEFT (eval)" if not bad else "; ".join(bad)


run("p05", check, host_module("05").Host)
