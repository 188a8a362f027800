"""Markdown helpers the report's tables share."""

from __future__ import annotations


def md_cell(text: object) -> str:
    """``text`` as one markdown table cell: pipes escaped, line breaks flattened."""
    return str(text).replace("|", "\\|").replace("\n", " ")
