"""p22: a state with a target module the host cannot apply is refused by raising (hooks.py, set_finetune_adapter)."""
import _common as c
from deltaserve_core.adapter_state import LoraAdapterState


def check(cls):
    d = c.build_lora_adapter(c.model_dir(), c.CACHE / "lora_lmhead_2_5", r=8, seed=5,
                             target_modules=("q_proj", "v_proj", "lm_head"), scale=0.08)
    state = LoraAdapterState.load_pretrained(d, name="job", version=1)
    heads = [k for k in state.tensors if "lm_head" in k]
    h = c.make(cls)
    try:
        h.set_finetune_adapter(state)
    except Exception as e:  # noqa: BLE001
        return True, f"state with {len(heads)} lm_head LoRA tensors refused: {type(e).__name__}: {str(e)[:90]}"
    applied = len(h._adapters["__deltaserve_finetune__"].pairs)
    return False, (f"state targeting q_proj, v_proj, lm_head accepted; {applied} (layer, module) pairs loaded, "
                   f"lm_head LoRA ({len(heads)} tensors) not applied")


c.run("p22", check, c.host_module("22").Host)
