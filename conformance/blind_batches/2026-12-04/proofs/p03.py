"""p03: fine-tuning rows run with the adapter's own scaling (lora_alpha / r) -- captures match PEFT."""
from _common import *  # noqa: F403

H = host_module("03").Host
SAMPLES = [sample(1, 11)]


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, SAMPLES)  # r=8 adapter, default max_lora_rank=16
    bad = capture_problems(h, sk, SAMPLES)
    return ran and not bad, f"r=8, max_lora_rank={h.config.max_lora_rank}: {bad[:3] or 'all captures match PEFT'}"


run("p03", check, H)
