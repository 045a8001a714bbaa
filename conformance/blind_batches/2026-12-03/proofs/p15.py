"""p15: a host that lends base weights lends every parameter transformers names (a tied head may be left out),
each a view of an engine weight holding the checkpoint's values; a host that does not lend passes."""
from transformers import AutoModelForCausalLM

from _common import host_module, make, model_dir, run

M = AutoModelForCausalLM.from_pretrained(str(model_dir()))
NAMES = {n: p for n, p in M.named_parameters()}
TIED = bool(M.config.tie_word_embeddings)


def check(cls):
    h = make(cls)
    lend = getattr(h, "base_weights", None)
    if lend is None:
        return True, "does not lend base weights (allowed: the core loads its own copy)"
    w = lend()
    if w is None:
        return True, "base_weights() returned None (allowed)"
    need = set(NAMES) - ({"lm_head.weight"} if TIED else set())
    missing, extra = sorted(need - set(w)), sorted(set(w) - set(NAMES))
    engine_ptrs = {p.data_ptr() for p in h.model.parameters()}
    bad_vals = [n for n, t in w.items() if n in NAMES and not bool((t.float() == NAMES[n].float()).all())]
    copies = [n for n, t in w.items() if t.data_ptr() not in engine_ptrs]
    ok = not (missing or extra or bad_vals or copies)
    return ok, (f"lends {len(w)} tensors (tie_word_embeddings={TIED}); missing {missing}, extra {extra}, "
                f"wrong values {bad_vals[:3]}, copies {copies[:3]}")


run("p15", check, host_module("15").Host)
