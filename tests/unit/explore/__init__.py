"""Unit tests of hil explore (harness/explore/): no engine starts."""
