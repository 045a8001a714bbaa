"""p16: fine-tuning rows use exactly the adapter (float32 engine)."""
from _common import *  # noqa: F401,F403

H = host_module("16").Host
SMPS = [sample(1, 24), sample(2, 40)]


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, SMPS)
    bad = capture_problems(h, sk, SMPS)
    return ran and not bad, f"float32 engine, FT-only step ran={ran}; captures vs PEFT (tol 1e-4): {bad or 'all match'}"


run("p16", check, H)
