"""Sampled requests: the parameters the harness sends, and a reference implementation of vLLM's
sampling semantics applied to the reference's fp32 logits (see docs/sampling.md).

- ``params``: ``SamplingSpec``, a request's sampling parameters, validated as vLLM validates them,
  converted to ``vllm.SamplingParams`` keyword arguments (vLLM is never imported here).
- ``pipeline``: the logits after every transformation vLLM 0.28 applies, in its order.
- ``judge``: teacher-forced per-position judgements along a device's tokens.
- ``noise``: the seeded-noise protocol per stack and the replay of a seeded request.
"""
