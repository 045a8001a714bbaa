"""DeltaServe adapter for S-LoRA: not implemented yet (issue #8).

This package is reserved in the layout so that the namespace is stable; it registers no host, so
`deltaserve hosts` does not list S-LoRA and `create_host("slora", ...)` fails with the list of installed
hosts. The adapter will translate S-LoRA's scheduler, model runner and plugin hooks into
:class:`deltaserve_core.hooks.HostHooks` and hold no policy of its own.
"""
