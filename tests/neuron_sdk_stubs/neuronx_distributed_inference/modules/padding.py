"""STUB (tests only): used by vllm-neuron for multimodal inputs only."""


def pad_tensor(*args, **kwargs):
    raise NotImplementedError("stub of the Neuron SDK: pad_tensor (multimodal) is not available")
