from common import *
RULE = ('HostHooks.publish_adapter: "A host must never serve KV computed with older weights under the returned name '
        '(publish under a fresh name/version or reset its prefix cache)" (a request in flight across a publish)')
def check(cls):
    h = make(cls); install(h)
    v1 = ft_state(name="job", version=1)
    v2 = v1.with_tensors({k: (t * 8 if "lora_B" in k else t) for k, t in v1.tensors.items()})
    n1 = h.publish_adapter(v1)
    h.submit(ClientRequest("old", prompt(12, 5), 8, adapter=n1))
    h.step(); h.step()
    n2 = h.publish_adapter(v2)
    old = [o for o in drain(h) if o.request_id == "old"][0]
    fresh = h.generate([ClientRequest("fresh", prompt(12, 5), 8, adapter=n2)])[0]
    if n2 != n1:
        return True, f"fresh name per version ({n1} -> {n2})"
    return old.token_ids == fresh.token_ids, (f"same name {n2!r} for both versions; request served under it over v1 KV: "
                                             f"{old.token_ids} vs fresh v2 {fresh.token_ids}")
run_proof("h18_publish_in_place_same_name", RULE, check, "blindhosts.h18_publish_in_place_same_name:Host")
