"""MkDocs hook: reference pages generated at build time from the code, so they cannot drift.

- reference/site-config.md: every key of a site file, from the `doc(text, default)` metadata of
  the dataclasses in trainctl/site.py (key path, type, default, description).
- reference/checks.md: every registered health check, from trainctl.health.registry.

Nothing here is committed as Markdown: the pages exist only in the build.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from mkdocs.structure.files import File

SITE_PAGE = "reference/site-config.md"
CHECKS_PAGE = "reference/checks.md"


def on_files(files, config):
    files.append(File.generated(config, SITE_PAGE, content=site_config_page()))
    files.append(File.generated(config, CHECKS_PAGE, content=checks_page()))
    return files


def site_config_page() -> str:
    from trainctl.site import PartitionConfig, SiteConfig

    lines = [
        "# Site config keys",
        "",
        "Generated from the field documentation of the site model (`trainctl/site.py`) each time",
        "these docs are built. A key that is not set takes the default shown; a key marked",
        "**required** must be set. Unknown keys and wrong types are refused when the site loads.",
        "How to write a site file: [Site config guide](../site-config.md).",
        "",
    ]
    hints = typing.get_type_hints(SiteConfig)
    plain = [f for f in dataclasses.fields(SiteConfig) if not _is_table(hints[f.name])]
    lines += _table("Top level", "", plain, hints)
    for f in dataclasses.fields(SiteConfig):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            sub_hints = typing.get_type_hints(hint)
            lines += _table(f"[{f.name}]", f"{f.name}.", dataclasses.fields(hint), sub_hints,
                            intro=f.metadata.get("doc", ""))
        elif typing.get_origin(hint) is dict and typing.get_args(hint)[1] is PartitionConfig:
            lines += _table(f"[{f.name}.NAME]", f"{f.name}.NAME.", dataclasses.fields(PartitionConfig),
                            typing.get_type_hints(PartitionConfig), intro=f.metadata.get("doc", ""))
    return "\n".join(lines) + "\n"


def _is_table(hint: Any) -> bool:
    if dataclasses.is_dataclass(hint):
        return True
    return typing.get_origin(hint) is dict and dataclasses.is_dataclass(typing.get_args(hint)[1])


def _table(title: str, prefix: str, fields, hints, intro: str = "") -> list[str]:
    lines = [f"## `{title}`" if title.startswith("[") else f"## {title}", ""]
    if intro:
        lines += [intro[0].upper() + intro[1:] + ".", ""]
    lines += ["| key | type | default | what it does |", "|---|---|---|---|"]
    for f in fields:
        lines.append(f"| `{prefix}{f.name}` | {_type_name(hints[f.name])} | {_default(f)} | "
                     f"{_cell(f.metadata.get('doc', ''))} |")
    return lines + [""]


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(f'`"{choice}"`' for choice in typing.get_args(hint))
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if typing.get_origin(item) is Literal:
            return "array of " + ", ".join(f'`"{choice}"`' for choice in typing.get_args(item))
        return f"array of {_type_name(item)}s"
    if origin is dict:
        return f"table of {_type_name(typing.get_args(hint)[1])}s"
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{_toml(f.default)}`"
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return "`{}`"
    return "**required**"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def checks_page() -> str:
    from trainctl.health.registry import all_checks

    lines = [
        "# Health checks",
        "",
        "Generated from the check registry (`trainctl health list --json` prints the same) each time",
        "these docs are built. *Hardware* names what a check is about: where the site declares none of",
        "it (no GPUs, `nvlink = \"none\"`, no `hca_ports`), the check is skipped with a reason.",
        "What the statuses mean and how a node's verdict is formed:",
        "[Node health checks](../health-checks.md).",
        "",
        "| check | what it judges | hardware | snapshot files it reads |",
        "|---|---|---|---|",
    ]
    for spec in all_checks():
        files = ", ".join(f"`{name}`" for name in spec.files) or "-"
        hardware = spec.hardware or "-"
        lines.append(f"| `{spec.name}` | {_cell(spec.description)} | {hardware} | {files} |")
    return "\n".join(lines) + "\n"
