"""p12: ModelSpec.dtype from the checkpoint. Truth: HostConfig.dtype and the dtype of the captured layer inputs."""
from _common import *

PATH = bf16_checkpoint()
S = [sample(1, 8)]


def check(cls):
    h = make_at(cls, PATH)  # HostConfig.dtype float32 (default)
    ic, sk, rec = install(h, plan=lambda b, i: S if i == 0 else [])
    h.set_finetune_adapter(ft_state(seed=7))
    h.run_idle_step()
    served = {str(e[4].dtype).replace("torch.", "") for e in sk.layers()}
    spec = h.model_spec().dtype
    return served == {spec} == {h.config.dtype}, (f"checkpoint saved bfloat16, HostConfig.dtype {h.config.dtype}; "
                                                   f"captures in {sorted(served)}; model_spec().dtype {spec!r}")


run("p12", check, host_module("12").Host)
