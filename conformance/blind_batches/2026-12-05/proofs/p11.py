"""p11: captures have the declared activation_dtype, the dtype the engine runs in (types.py, HostCapabilities)."""
import _common as c


def check(cls):
    samples = [c.sample(1, 10), c.sample(2, 14)]
    h, ic, sk, rec, ran = c.idle_capture(cls, samples)
    declared = h.capabilities().activation_dtype
    dtypes = sorted({str(e[4].dtype).replace("torch.", "") for e in sk.layers()})
    bad = c.capture_problems(h, sk, samples)
    ok = ran and dtypes == [declared] == [h.config.dtype] and not bad
    return ok, f"engine dtype {h.config.dtype}, declared {declared}, captures {dtypes}; vs PEFT: {bad[:2] or 'all match'}"


c.run("p11", check, c.host_module("11").Host)
