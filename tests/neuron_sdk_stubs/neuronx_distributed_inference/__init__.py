"""STUB of NxD Inference (neuronx-distributed-inference) for tests; see ../README.md."""

STUB = True
