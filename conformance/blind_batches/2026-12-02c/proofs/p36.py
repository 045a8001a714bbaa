"""p36: on a bf16 host, model_spec().dtype is the dtype the served weights have."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls, dtype="bfloat16")
    served = str(next(h.model.parameters()).dtype).replace("torch.", "")
    spec = h.model_spec().dtype
    return spec == served, f"model_spec dtype {spec!r}, served weights {served!r}"


run("p36", check, host_module("36").Host)
