"""A report as a list of blocks, rendered to Markdown or to self-contained HTML.

Building the content and rendering it are separate, so the Markdown and HTML reports can
never disagree.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class TableBlock:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    right_aligned: frozenset[int] = frozenset()  # column indexes


@dataclass(frozen=True)
class Image:
    path: Path  # a PNG beside the report
    alt: str


Block = Heading | Paragraph | Bullets | TableBlock | Image


def to_markdown(blocks: list[Block]) -> str:
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append(f"{'#' * block.level} {block.text}")
        elif isinstance(block, Paragraph):
            out.append(block.text)
        elif isinstance(block, Bullets):
            out.append("\n".join(f"- {item}" for item in block.items))
        elif isinstance(block, TableBlock):
            out.append(_markdown_table(block))
        elif isinstance(block, Image):
            out.append(f"![{block.alt}]({block.path.name})")
    return "\n\n".join(out) + "\n"


def _markdown_table(table: TableBlock) -> str:
    def row(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rule = tuple("---:" if i in table.right_aligned else "---" for i in range(len(table.headers)))
    return "\n".join([row(table.headers), "| " + " | ".join(rule) + " |", *(row(r) for r in table.rows)])


_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 75rem; margin: 2rem auto; padding: 0 1rem;
       color: #1b1b1b; background: #ffffff; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.9rem; }
th, td { border: 1px solid #c8c8c8; padding: 0.25rem 0.6rem; }
th { background: #f0f0f0; }
td.r { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; border: 1px solid #ddd; }
code { background: #f3f3f3; padding: 0 0.2rem; }
"""


def to_html(blocks: list[Block], title: str) -> str:
    """One self-contained HTML page: styles inline, images embedded as data URIs."""
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>",
             f"<style>{_STYLE}</style></head><body>"]
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{html.escape(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{_inline(block.text)}</p>")
        elif isinstance(block, Bullets):
            parts.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block.items) + "</ul>")
        elif isinstance(block, TableBlock):
            parts.append(_html_table(block))
        elif isinstance(block, Image):
            data = base64.b64encode(block.path.read_bytes()).decode()
            parts.append(f'<p><img alt="{html.escape(block.alt)}" src="data:image/png;base64,{data}"></p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _html_table(table: TableBlock) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in table.headers)
    body = "".join(
        "<tr>" + "".join(f'<td{" class=r" if i in table.right_aligned else ""}>{html.escape(c)}</td>'
                         for i, c in enumerate(row)) + "</tr>"
        for row in table.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _inline(text: str) -> str:
    """Escape, then turn `code` spans into <code>."""
    pieces = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(pieces))
