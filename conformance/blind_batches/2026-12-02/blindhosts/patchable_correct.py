from ._base import Patchable as Host  # noqa: F401  (control: the refactored reference, unmodified)
