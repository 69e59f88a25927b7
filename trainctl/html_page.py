"""One self-contained HTML page (inline CSS and SVG, nothing fetched): the sweep report's and the
job chain's. Pure: text in, text out."""

from __future__ import annotations

import html

from trainctl.text import printable

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:16px 0 4px} .meta{color:#555} .warn-box{background:#fff3e0;border-left:4px solid #ff7043;
padding:6px 10px;margin:8px 0} table{border-collapse:collapse;margin:4px 0 12px;min-width:480px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top} th{background:#f5f5f5}
code{font:12px ui-monospace,monospace;background:#f5f5f5;padding:1px 4px}
.badge{display:inline-block;color:#fff;border-radius:3px;padding:0 6px;font-size:12px;margin-right:6px}
.reason{margin:2px 0 6px;font-family:ui-monospace,monospace;font-size:12px}
.legend span{display:inline-block;margin-right:12px} .legend i{display:inline-block;width:10px;height:10px;
margin-right:4px;border:1px solid #999}
"""


def escape(text: object) -> str:
    """`text` for HTML: escaped, and control characters written as escapes (`trainctl.text`)."""
    return html.escape(printable(str(text)), quote=True)


def page_head(title: str) -> list[str]:
    """The page's start, to its <body>."""
    return ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{escape(title)}</title>",
            f"<style>{STYLE}</style></head><body>"]


def legend(colours: dict[str, str]) -> str:
    """A swatch and a name for each colour."""
    items = "".join(f'<span><i style="background:{colour}"></i>{escape(name)}</span>' for name, colour in colours.items())
    return f'<p class="legend">{items}</p>'
