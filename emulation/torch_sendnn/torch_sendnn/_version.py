"""The version vllm-spyre reads (``sendnn_configured``); ``+emulated`` marks the stand-in."""

__version__ = "1.1.0+emulated"
EMULATED = True
