"""p11: ModelSpec.layer_module resolves, on the transformers model at ModelSpec.path, to its decoder-layer list."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    spec = h.model_spec()
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(spec.path)
    obj = m
    try:
        for part in spec.layer_module.split("."):
            obj = getattr(obj, part)
    except AttributeError as e:
        return False, f"layer_module {spec.layer_module!r}: not a path of {type(m).__name__} ({e})"
    ok = isinstance(obj, torch.nn.ModuleList) and len(obj) == spec.num_layers
    return ok, f"layer_module {spec.layer_module!r} -> {type(obj).__name__} of {len(obj) if ok else '?'} layers"


run("p11", check, host_module("11").Host)
