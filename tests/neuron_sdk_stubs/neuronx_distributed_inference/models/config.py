"""STUB of NxD Inference's config classes: they keep their keyword arguments."""

from typing import Any


class _Kwargs:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    def to_dict(self) -> dict:
        return {k: (v.to_dict() if isinstance(v, _Kwargs) else v) for k, v in self.__dict__.items()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()})"


class OnDeviceSamplingConfig(_Kwargs):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("global_topk", 256)  # NxD Inference's default
        super().__init__(**kwargs)


class ChunkedPrefillConfig(_Kwargs):
    pass


class FusedSpecNeuronConfig(_Kwargs):
    pass


class NeuronConfig(_Kwargs):
    def __init__(self, **kwargs: Any) -> None:
        for name, default in (("is_block_kv_layout", False), ("is_prefix_caching", False),
                              ("chunked_prefill_config", None), ("quantized", False),
                              ("on_device_sampling_config", None),
                              ("is_chunked_prefill", False)):
            kwargs.setdefault(name, default)
        super().__init__(**kwargs)


class InferenceConfig:
    def __init__(self, neuron_config: NeuronConfig, load_config: Any = None) -> None:
        self.neuron_config = neuron_config
        self.load_config = load_config

    def to_json_string(self) -> str:
        import json

        return json.dumps(self.neuron_config.to_dict(), sort_keys=True, default=repr)
