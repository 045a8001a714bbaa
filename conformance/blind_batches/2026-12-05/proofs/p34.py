"""p34: model_spec().dtype is the dtype the engine serves the model in (types.py, ModelSpec)."""
import _common as c
import torch


def check(cls):
    h = c.make(cls)
    spec = h.model_spec()
    ok = spec.dtype == h.config.dtype and isinstance(getattr(torch, spec.dtype, None), torch.dtype)
    return ok, f"engine serves {h.config.dtype} (model params {next(h.model.parameters()).dtype}); model_spec().dtype={spec.dtype!r}"


c.run("p34", check, c.host_module("34").Host)
