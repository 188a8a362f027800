"""STUB (tests only): the on-device sampling parameters tensor, one row per batch line."""

import torch


def prepare_sampling_params(batch_size, top_k=None, top_p=None, temperature=None):
    top_k = top_k if top_k is not None else [1] * batch_size
    top_p = top_p if top_p is not None else [1.0] * batch_size
    temperature = temperature if temperature is not None else [1.0] * batch_size
    return torch.tensor([list(row) for row in zip(top_k, top_p, temperature, strict=True)], dtype=torch.float32)
