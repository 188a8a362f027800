"""spyre: the Spyre plugin (vllm-spyre) on a card (sendnn) or in its CPU mode (eager), and all the harness knows of it."""
