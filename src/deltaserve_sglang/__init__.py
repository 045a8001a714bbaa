"""DeltaServe adapter for SGLang: not implemented yet (issue #6).

This package is reserved in the layout so that the namespace is stable; it registers no host, so
`deltaserve hosts` does not list SGLang and `create_host("sglang", ...)` fails with the list of installed
hosts. The adapter will translate SGLang's scheduler, model runner and plugin hooks into
:class:`deltaserve_core.hooks.HostHooks` and hold no policy of its own.
"""
