from ._base import GraphCapable as Host  # noqa: F401  (control: correct graph-capable host)
