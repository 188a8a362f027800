"""The CPU reference: transformers greedy outputs, their cache on disk, and the checks an entry passes before it is trusted."""
