"""STUB (tests only)."""
