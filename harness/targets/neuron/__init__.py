"""neuron: vllm-neuron on AWS Inferentia/Trainium, and all the harness knows of it (config, SDK, inventory)."""
