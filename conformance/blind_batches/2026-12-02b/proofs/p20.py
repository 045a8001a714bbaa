"""h20: an adapter with MLP targets is either refused (raise) or applied in full."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    state = c.lora_state(seed=4, targets=("q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"))
    try:
        h.set_finetune_adapter(state)
    except Exception as e:
        return True, f"refused: {type(e).__name__}"
    s = c.sample(18, 10)
    ic, sink, recs = c.install(h, plan=[(s,)], adapter=False)
    assert h.run_idle_step()
    return c.check_captures(sink, [s], state)


sys.exit(c.verdict(check, "20"))
