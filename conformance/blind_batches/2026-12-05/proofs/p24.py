"""p24: with ignore_eos=False a request stops at its first EOS, EOS included as its last token (driver.py,
ClientRequest). Prompt chosen so the tiny model's greedy continuation reaches EOS (found once by search)."""
import _common as c


def check(cls):
    h = c.make(cls)
    p = c.prompt(8, 23)
    eos = h.model.config.eos_token_id
    full = c.hf_greedy(p, 20)
    truth = full[: full.index(eos) + 1] if eos in full else full
    outs = h.generate([c.ClientRequest("e", p, 20, ignore_eos=False)])
    got = list(outs[0].token_ids)
    ok = got == truth and len(outs[0].token_times) == len(got)
    return ok, f"truth (HF greedy, cut at EOS {eos}) {truth}; got {got}"


c.run("p24", check, c.host_module("24").Host)
