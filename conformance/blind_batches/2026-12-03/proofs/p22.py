"""p22: on a bfloat16 host every capture has the declared activation dtype and the PEFT model's values
(bf16 PEFT truth, bf16 tolerance)."""
import torch

from _common import capture_problems, host_module, idle_capture, run, sample

S = sample(1, 10)


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, [S], dtype="bfloat16")
    want = getattr(torch, h.capabilities().activation_dtype)
    dtypes = sorted({str(e[4].dtype) for e in sk.layers()})
    bad = capture_problems(h, sk, [S], tol=6e-2, dtype=torch.bfloat16)
    ok = ran and dtypes == [str(want)] and not bad
    return ok, f"declared {h.capabilities().activation_dtype}, captures {dtypes}" + ("; " + "; ".join(bad[:2]) if bad else "")


run("p22", check, host_module("22").Host)
