"""Text for failures: the token diff and the per-step ledger table."""
