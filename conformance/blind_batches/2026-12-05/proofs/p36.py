"""p36: shutdown frees the engine's memory, here the KV cache of a request in flight (driver.py, shutdown).
Checked with weak references to the request's KV tensors after gc."""
import gc
import weakref

import _common as c


def check(cls):
    h = c.make(cls)
    h.submit(c.req("r", 12, 26, 10))
    h.step()
    h.step()
    refs = [weakref.ref(t) for kv in h._running[0].kv for t in kv]
    h.shutdown()
    h.shutdown()  # idempotent
    gc.collect()
    alive = sum(r() is not None for r in refs)
    return alive == 0, f"request stopped mid-generation: {alive} of {len(refs)} KV tensors still alive after shutdown()"


c.run("p36", check, c.host_module("36").Host)
