"""The report as files: Markdown as written, and a self-contained HTML page (markdown-it-py renders the
Markdown; figures are embedded as data URIs; Jinja2 fills the page template)."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from jinja2 import Environment
from markdown_it import MarkdownIt

PAGE = Environment(autoescape=True).from_string(
    """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1400px;color:#222;
padding:0 1em}
table{border-collapse:collapse;margin:1em 0;font-size:14px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left}th{background:#f0f0f0}
tr:nth-child(even){background:#fafafa}td:first-child{white-space:nowrap}
img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}
h2{border-bottom:1px solid #ddd;padding-bottom:0.2em;margin-top:1.5em}
</style></head>
<body>
{{ body }}
</body></html>
"""
)
# CommonMark with GitHub tables; raw HTML in the text (e.g. in an error message) is escaped, not rendered.
MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")


def to_html(markdown: str, title: str, images: list[Path]) -> str:
    """The page: ``markdown`` rendered, each of ``images`` (referenced by file name) embedded.

    The images go into the rendered ``src`` attributes, not into the Markdown: markdown-it would otherwise
    tokenize every base64 character of them (about 1 s for a sweep's three figures)."""
    body = MARKDOWN.render(markdown)
    for path in images:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        body = body.replace(f'src="{html.escape(path.name)}"', f'src="data:image/png;base64,{data}"')
    return PAGE.render(title=title, body=_Safe(body))


class _Safe(str):
    """Rendered HTML that the template inserts as it is (markdown-it has already escaped the text)."""

    def __html__(self) -> str:
        return str(self)
