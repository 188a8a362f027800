"""Pinned stacks: the stack files, their install, hashed locks, and the host stack (standard library only)."""
