"""Markdown tables, for the report and the generated reference pages (only the standard library: the
reference is written without the report's machinery)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Table:
    """Rows of text under headers."""

    headers: list[str]
    rows: list[list[str]]

    def markdown(self) -> str:
        """A GitHub-flavoured Markdown table (pipes in cells escaped)."""
        lines = ["| " + " | ".join(self.headers) + " |", "|" + "---|" * len(self.headers)]
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in self.rows]
        return "\n".join(lines)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
