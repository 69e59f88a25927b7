"""`trainctl site ...`: which site configs exist and what one of them sets."""

from __future__ import annotations

import json

import click


@click.group("site")
def site() -> None:
    """Site configs: list them, show what one sets and where each value came from."""


@site.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: name -> file.")
def list_sites(as_json: bool) -> None:
    """List the sites found on the search path (later directories win)."""
    from trainctl.site import available_sites, site_dirs

    dirs = site_dirs()
    sites = available_sites(dirs)
    if as_json:
        click.echo(json.dumps({name: str(path) for name, path in sorted(sites.items())}, indent=1))
        return
    for name, path in sorted(sites.items()):
        click.echo(f"{name:<20} {path}")
    click.echo("trainctl: searched (later wins): " + ", ".join(str(d) for d in dirs), err=True)


@site.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: key -> {value, source}.")
def show_site(name: str, as_json: bool) -> None:
    """Print every setting of site NAME (a name or a .toml path) and where it came from."""
    from trainctl.health.check_names import check_site_check_names
    from trainctl.site import flatten, load_site

    loaded = load_site(name)
    check_site_check_names(loaded)
    rows = [(key, value, loaded.source_of(key)) for key, value in flatten(loaded.config)]
    if as_json:
        click.echo(json.dumps({key: {"value": list(value) if isinstance(value, tuple) else value,
                                     "source": source} for key, value, source in rows}, indent=1))
        return
    from trainctl.text import printable

    lines = [f"# site {loaded.config.name} from {loaded.path}"]
    width = max(len(key) for key, _, _ in rows)
    for key, value, source in rows:
        shown = json.dumps(list(value) if isinstance(value, tuple) else value)  # JSON escapes controls
        lines.append(f"{key:<{width}} = {shown}    # {'default' if source == 'default' else 'file'}")
    click.echo("\n".join(printable(line) for line in lines))  # a newline in a value stays `\n`
