"""p20: base_weights lends every parameter name (views)."""
from _common import *  # noqa: F401,F403

from transformers import AutoModelForCausalLM

Base = base_module("_lending").LendingHost
H = host_module("20").Host


def check(cls):
    h = make(cls)
    fn = getattr(h, "base_weights", None)
    lent = fn() if callable(fn) else None
    if lent is None:
        return True, "does not lend (no base_weights / None: allowed)"
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir()), dtype=torch.float32)
    truth = dict(hf.named_parameters())
    optional = {"lm_head.weight"} if hf.config.tie_word_embeddings else set()
    missing = sorted(set(truth) - set(lent) - optional)
    extra = sorted(set(lent) - set(truth))
    ptrs = {p.data_ptr() for p in h.model.parameters()}
    copies = [n for n, t in lent.items() if t.data_ptr() not in ptrs]
    wrong = [n for n, t in lent.items() if n in truth and not torch.equal(t, truth[n])]
    ok = not (missing or extra or copies or wrong)
    return ok, (f"lent {len(lent)} of {len(truth)} HF parameters; missing {missing}, extra {extra}, copies "
                f"{len(copies)}, wrong values {len(wrong)}")


run_with_base("p20", check, Base, H)
