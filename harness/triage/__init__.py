"""Triage: re-run a failed token-equality or KV verdict under varied conditions, and say what
the failure depends on (batching, recycled blocks, chunked prefill, prefix caching, the stack,
chance) with the runs behind it."""
