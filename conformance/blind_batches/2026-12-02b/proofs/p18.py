"""h18: after set_finetune_adapter returns, changing the caller's tensors in place does not change the forward."""
import sys
import torch
import _common as c


def check(cls):
    h = c.make(cls)
    state = c.lora_state(seed=3)
    kept = c.LoraAdapterState(state.name, state.version, state.config,
                              {k: v.clone() for k, v in state.tensors.items()}, state.base_model_path)
    s = c.sample(16, 10)
    ic, sink, recs = c.install(h, plan=[(s,)], adapter=state)
    with torch.no_grad():
        for k, v in state.tensors.items():
            if "lora_B" in k:
                v.mul_(-4.0)  # the optimizer keeps training the caller's tensors
    assert h.run_idle_step()
    return c.check_captures(sink, [s], kept)


sys.exit(c.verdict(check, "18"))
