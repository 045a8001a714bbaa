"""DeltaServe adapter for vLLM: not implemented yet (issue #5).

This package is reserved in the layout so that the namespace is stable; it registers no host, so
`deltaserve hosts` does not list vLLM and `create_host("vllm", ...)` fails with the list of installed
hosts. The adapter will translate vLLM's scheduler, model runner and plugin hooks into
:class:`deltaserve_core.hooks.HostHooks` and hold no policy of its own.
"""
