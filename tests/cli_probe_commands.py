"""Small commands the CLI tests graft onto `trainctl` to exercise the error funnel for real."""

import time

import click

from trainctl.errors import ConfigError


@click.command()
def sleep_forever() -> None:
    click.echo("sleeping", err=True)
    time.sleep(60)


@click.command()
def many_lines() -> None:
    for i in range(100000):
        click.echo(f"line {i}")


@click.command()
def bad_config() -> None:
    raise ConfigError("site-configs/x.toml: [partition.gpu] nodes: expected an integer, got 'four'")


@click.command()
def bug() -> None:
    raise KeyError("oops")


not_a_command = object()
