"""Emulated torch_sendnn: registers the ``sendnn`` dynamo backend on import, as the vendor's does."""

from torch_sendnn import backends
from torch_sendnn._version import __version__
from torch_sendnn.backend import register_backend
from torch_sendnn.warmup import warmup_mode

register_backend()

__all__ = ["backends", "__version__", "warmup_mode"]
