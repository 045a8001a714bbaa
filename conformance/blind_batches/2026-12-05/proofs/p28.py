"""p28: greedy outputs are the model's greedy continuation of each prompt, also when prompts share a step
(driver.py, ClientRequest / HostDriver.generate). Truth: transformers greedy decoding, one request at a time."""
import _common as c


def check(cls):
    h = c.make(cls)
    reqs = [c.req("a", 8, 18, 8), c.req("b", 10, 19, 8), c.req("c", 7, 20, 8)]
    outs = h.generate(reqs)
    bad = []
    for r, o in zip(reqs, outs):
        truth = c.hf_greedy(r.prompt_ids, r.max_tokens)
        if list(o.token_ids) != truth:
            bad.append(f"{r.request_id}: got {list(o.token_ids)}, truth {truth}")
    return not bad, "3 prompts prefilled in one step: " + ("; ".join(bad) or "all match HF greedy")


c.run("p28", check, c.host_module("28").Host)
