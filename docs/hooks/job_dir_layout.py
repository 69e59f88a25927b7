"""MkDocs hook: the job directory's layout in gate.md, generated at build time from the module that
owns the directory (trainctl.job.jobdir.LAYOUT), so a file added there is in the docs."""

from __future__ import annotations

MARKER = "<!-- job directory layout: generated from trainctl.job.jobdir -->"
PAGE = "gate.md"


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE} lost its marker {MARKER!r}: the job directory's table goes there")
    from trainctl.job.jobdir import layout_table

    return markdown.replace(MARKER, layout_table())
