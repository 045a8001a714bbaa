"""p23: max_finetune_tokens_per_step is the host's token budget (max_batch_tokens, minus nothing else), and a
fine-tuning-only step of exactly that many tokens runs."""
from _common import host_module, idle_capture, run, sample

BUDGET = 256
SAMPLES = [sample(1, 200), sample(2, 56)]


def check(cls):
    try:
        h, ic, sk, rec, ran = idle_capture(cls, SAMPLES, max_batch_tokens=BUDGET)
        caps = h.capabilities()
        done = [x.finetune_sample_ids for x in rec.records]
        note = f"step of {BUDGET} fine-tuning tokens ran: {ran}, completed {done}"
    except Exception as e:  # noqa: BLE001
        from _common import make
        caps, ran, note = make(cls, max_batch_tokens=BUDGET).capabilities(), False, f"step of {BUDGET} tokens: {e}"
    ok = caps.max_finetune_tokens_per_step == BUDGET and ran
    return ok, f"max_batch_tokens={BUDGET}, declared max_finetune_tokens_per_step={caps.max_finetune_tokens_per_step}; {note}"


run("p23", check, host_module("23").Host)
