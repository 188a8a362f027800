"""STUB (tests only)."""

from neuronx_distributed_inference.models.config import _Kwargs


class LoraServingConfig(_Kwargs):
    pass
