"""h29: a step carrying fine-tuning tokens within max_finetune_tokens_per_step runs."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    cap = h.capabilities().max_finetune_tokens_per_step
    samples = (c.sample(20, 300), c.sample(21, 300))
    assert 600 <= cap, cap
    ic, sink, recs = c.install(h, plan=[samples])
    assert h.run_idle_step()
    r = recs[-1]
    ok = set(r.finetune_sample_ids) == {20, 21}
    return ok, f"declared {cap}; 600 tokens -> record ft={r.finetune_sample_ids} aborted={r.aborted_sample_ids}"


sys.exit(c.verdict(check, "29"))
