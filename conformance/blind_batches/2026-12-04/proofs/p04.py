"""p04: an adapter with MLP targets is applied in full or refused by raising, never run in part."""
from _common import *  # noqa: F403

H = host_module("04").Host
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SAMPLES = [sample(1, 12)]


def check(cls):
    folder = adapter_dir("ft", seed=9, targets=ALL)
    st = LoraAdapterState.load_pretrained(folder, name="job", version=1)
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: SAMPLES if i == 0 else [])
    try:
        h.set_finetune_adapter(st)
    except Exception as e:  # noqa: BLE001
        return True, f"refused by raising: {type(e).__name__}: {e}"
    ran = h.run_idle_step()
    bad = capture_problems(h, sk, SAMPLES, adapter=folder)
    return ran and not bad, (f"accepted {len(st.modules())} modules (with MLP); captures vs PEFT: "
                             f"{bad[:3] or 'all match'}")


run("p04", check, H)
