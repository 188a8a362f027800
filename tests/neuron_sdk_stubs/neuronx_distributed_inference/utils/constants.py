"""STUB of NxD Inference's model table, and the stand-in for a compiled model on the device."""

import json
from pathlib import Path
from types import SimpleNamespace

import torch

from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig

MARKER = "stub-compiled.json"
STUB_VOCAB = 2048  # the harness's tiny models' vocabulary


class StubNeuronModel:
    """What NxD Inference's compiled model is to vllm-neuron: compile, load, forward."""

    compiled: list = []  # paths compiled in this process (read by the probe)

    def __init__(self, model_path, config=None):
        self.model_path = str(model_path)
        self.config = config

    @staticmethod
    def get_neuron_config_cls():
        return NeuronConfig

    @staticmethod
    def get_config_cls():
        return InferenceConfig

    def compile(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / MARKER).write_text(self.config.to_json_string())
        StubNeuronModel.compiled.append(str(path))

    def load(self, path):
        marker = Path(path) / MARKER
        if not marker.is_file():
            raise FileNotFoundError(f"stub: no compiled model in {path}")
        if self.config is None:
            self.config = InferenceConfig(NeuronConfig(**json.loads(marker.read_text())))

    def __call__(self, input_ids, attention_mask=None, seq_ids=None, position_ids=None, **kwargs):
        batch, seq = input_ids.shape[0], input_ids.shape[-1]
        logits = torch.zeros(batch, seq, STUB_VOCAB)
        last = position_ids[:, -1] if position_ids is not None else torch.zeros(batch, dtype=torch.long)
        winners = (last.reshape(-1).long() * 7 + 3) % STUB_VOCAB
        logits[torch.arange(batch), -1, winners] = 5.0
        return SimpleNamespace(logits=logits, hidden_states=winners)


MODEL_TYPES = {
    "llama": {"causal-lm": StubNeuronModel},
    "qwen2": {"causal-lm": StubNeuronModel},
    "qwen3": {"causal-lm": StubNeuronModel},
}
