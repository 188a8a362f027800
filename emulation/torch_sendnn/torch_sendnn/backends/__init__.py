"""``torch_sendnn.backends``: where sendnn-inference 2.x reads the backend's captured state."""

from torch_sendnn.backends import sendnn_backend

__all__ = ["sendnn_backend"]
