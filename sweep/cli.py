"""`trainctl sweep`, `report`, `drain` and `resume`: nightly health sweeps, their history, and drains.

Each command imports what it needs when it runs, so `trainctl --help` stays Click alone.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click

from trainctl.validate import DAY_S, SITE_BOUNDS, Bounds, Number

DEFAULT_SINCE = "7d"
SINCE_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_SINCE_DAYS = 100_000   # 274 years: "all of it"; further back a date has no year to show

db_option = click.option("--db", "db_path", type=click.Path(dir_okay=False),
                         help="Sweep history (SQLite). Default: the site's [sweep] db, "
                              "else /var/lib/trainctl/sweeps.db.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")


def _progress(message: str) -> None:
    click.echo(f"trainctl: {message}", err=True)


def _load_site(site: str | None, *, runs_checks: bool = False):
    """(site config or None, the argument as the nodes should see it); with `runs_checks`, its
    check names are checked first (a sweep would otherwise find a misspelt one on every node)."""
    if site is None:
        return None, None
    from trainctl.health.check_names import check_site_check_names
    from trainctl.site import load_site

    loaded = load_site(site)
    if runs_checks:
        check_site_check_names(loaded)
    # A file is handed to the nodes by absolute path; a name they resolve themselves.
    given = str(loaded.path.resolve()) if site.endswith(".toml") or "/" in site else site
    return loaded.config, given


def _db(db_path: str | None, config) -> Path:
    from trainctl.site import SweepConfig

    return Path(db_path or (config.sweep.db if config else SweepConfig().db)).expanduser()


def parse_since(text: str) -> float:
    """'7d', '36h', '2w', '90m' -> seconds (finite, more than 0, at most MAX_SINCE_DAYS)."""
    from trainctl.validate import check_number

    number, unit = text[:-1], text[-1:].lower()
    try:  # check_number refuses nan and inf (InvalidValue is a ValueError)
        seconds = check_number(float(number), Bounds(0, low_open=True)) * SINCE_UNITS[unit]
    except (ValueError, KeyError):
        raise click.BadParameter(f"{text!r} is not a duration like 7d, 36h, 2w or 90m", param_hint="--since") from None
    if seconds > MAX_SINCE_DAYS * SINCE_UNITS["d"]:
        raise click.BadParameter(f"{text!r} reaches back more than {MAX_SINCE_DAYS} days", param_hint="--since")
    return seconds


def _node_command(config, given_site: str, partition: str | None, timeout_s: float | None, fabric: bool):
    from trainctl.sweep.collect import NodeCommand

    checks = tuple(config.sweep.checks)
    if "all" in checks:
        # Every family by name: without --only, `health check` would run the gate's (shorter) list.
        from trainctl.health.registry import all_checks

        checks = tuple(sorted({spec.name.split(".")[0] for spec in all_checks()}))
    return NodeCommand(python=config.sweep.node_python or sys.executable, site=given_site, partition=partition,
                       only=checks, timeout_s=timeout_s or config.sweep.node_timeout_s,
                       fabric_timeout_s=config.gate.fabric_timeout_s if fabric else None)


def _ssh_access(config):
    from trainctl.sweep.collect import SshAccess

    s = config.sweep
    return SshAccess(user=s.ssh_user, port=s.ssh_port, key_path=s.ssh_key, known_hosts=s.known_hosts)


# ---------------------------------------------------------------- sweep

@click.command("sweep")
@click.option("--site", required=True, help="Site name or .toml file (checks, timeouts, SSH access, db).")
@click.option("--partition", help="Partition to sweep (default: the site's default partition).")
@click.option("--nodes", "hostlist", help="Only these nodes, as a Slurm hostlist: gpu[01-08,10].")
@click.option("--via", type=click.Choice(["slurm", "ssh"]), default="slurm", show_default=True,
              help="slurm: one job on the idle nodes; ssh: a parallel fan-out (nodes outside Slurm).")
@click.option("--fabric", is_flag=True, help="Also run the pairwise fabric test (Slurm only), "
                                              "recorded per node as check fabric.allreduce.")
@click.option("--fanout", type=Number(int, SITE_BOUNDS["sweep.fanout"]),
              help="SSH: nodes at once (default: site's [sweep] fanout).")
@click.option("--timeout", "timeout_s", type=Number(float, Bounds(1, DAY_S)),
              help="Seconds a node's checks may take before it counts as timed out (default: site).")
@click.option("--exit-zero", is_flag=True,
              help="Exit 0 once every node's result is recorded, whatever the nodes' verdicts: for systemd and "
                   "cron, where a non-zero exit must mean that the sweep itself failed (2 bad input or site, "
                   "4 Slurm or SSH, 70 a bug), not that it found a failing node.")
@db_option
@json_option
def sweep(site, partition, hostlist, via, fabric, fanout, timeout_s, exit_zero, db_path, as_json):
    """Check every node of a partition (or a hostlist) and record the results in the history.

    With --via slurm (the default) one job runs on the idle nodes, one task per node; nodes
    that are allocated, drained or down are recorded as not swept with their Slurm state. A
    node whose checks outrun --timeout is recorded as timed out, apart from failing nodes.
    Each node is committed as its answer arrives. Progress goes to stderr.

    Exit code: the worst node status (0 ok, 1 warn, 2 fail, 3 unknown or no verdict), or 0
    with --exit-zero; 2 for bad input, 4 if Slurm or SSH itself failed.
    """
    from trainctl.errors import UsageError
    from trainctl.site import partition as pick_partition
    from trainctl.slurm import expand_hostlist
    from trainctl.sweep.collect import gpu_request_args
    from trainctl.sweep.db import History
    from trainctl.sweep.runner import SweepRequest, describe, run_sweep

    config, given_site = _load_site(site, runs_checks=True)
    from trainctl.validate import check_node_name

    # each becomes a host of the history, which holds node names only (sweep.db._host)
    nodes = ([check_node_name(node, "--nodes") for node in expand_hostlist(hostlist, source="--nodes")]
             if hostlist else None)
    if fabric and via != "slurm":
        raise UsageError("--fabric needs --via slurm: the fabric test runs as one Slurm step")
    if via == "slurm" or partition or not nodes:
        partition, part = pick_partition(config, partition)
    else:  # SSH to named nodes, maybe outside Slurm: judged by the default partition's hardware
        part = pick_partition(config, None)[1]
    request = SweepRequest(
        kind="sweep", site=given_site, via=via, partition=partition, nodes=nodes,
        command=_node_command(config, given_site, partition, timeout_s, fabric),
        gpu_args=gpu_request_args(config.slurm.gpu_request, part.gpus_per_node),
        access=_ssh_access(config), fanout=fanout or config.sweep.fanout,
        odd_node_fails=config.gate.odd_node_out == "fail")
    with History.open(_db(db_path, config), write=True) as history:
        result = run_sweep(request, history, _progress)
        if config.fleet.journal_dir or config.fleet.lemons_file:
            _fold(history, config, ())
        if config.sweep.keep_days > 0:
            removed = history.prune(time.time() - config.sweep.keep_days * DAY_S)
            if removed:
                _progress(f"history: removed {removed} sweep(s) older than {config.sweep.keep_days:g} days "
                          "([sweep] keep_days)")
    nodes_out = sorted(result.nodes.values(), key=lambda n: n.host)
    code = 0 if exit_zero else result.exit_code
    if as_json:
        click.echo(json.dumps({
            "sweep": result.sweep_id, "db": str(history.path), "exit_code": code,
            "nodes": [{"host": n.host, "outcome": n.outcome, "status": n.status, "slurm_state": n.slurm_state,
                       "detail": n.detail, "duration_s": n.duration_s,
                       "checks": [{"name": c.name, "status": c.status, "reason": c.reason} for c in n.checks]}
                      for n in nodes_out]}, indent=1))
    else:
        click.echo(f"sweep #{result.sweep_id} recorded in {history.path}")
        for node in nodes_out:
            click.echo(f"  {describe(node)}")
    return code


# ---------------------------------------------------------------- history

def _fold(history, config, paths: tuple[str, ...]):
    """Fold the site's journal directory (and `paths`) into the open history, then rewrite its lemons
    file; progress to stderr. The fold's result, and why the lemons file was not written ("" if it was)."""
    from trainctl.sweep.fleet import fold_journals, journal_paths

    now = time.time()
    keep_after = now - config.sweep.keep_days * DAY_S if config.sweep.keep_days > 0 else 0.0
    found = journal_paths(config.fleet.journal_dir, paths)
    result = fold_journals(history, found, site=config.name, now=now, keep_after=keep_after, say=_progress,
                           unverified_journals=config.fleet.unverified_journals)
    _progress(f"history: folded in {result.folded} job journal(s) ({result.events} node verdicts), "
              f"{result.unchanged} unchanged, {len(result.refused)} refused")
    if result.uncounted:
        _progress(f"history: {result.uncounted} job journal(s) not counted: no Slurm accounting to vouch for their "
                  f"jobs ({result.no_accounting}); [fleet] unverified_journals = true counts them on weaker checks")
    elif result.no_accounting:
        _progress(f"history: Slurm's accounting did not answer ({result.no_accounting}): {result.unverified} "
                  "journal(s) folded in unverified, checked only by their file's owner and the nodes the history "
                  "knows ([fleet] unverified_journals)")
    return result, _publish(history, config, now)


def _publish(history, config, now: float) -> str:
    """Rewrite the site's lemons file from the history; why not, in one line, where it was not."""
    from trainctl.errors import UsageError
    from trainctl.sweep.fleet import publish_lemons

    if not config.fleet.lemons_file:
        return ""
    if not _same_file(history.path, _db(None, config)):
        why = (f"lemons file {config.fleet.lemons_file} not written: {history.path} is not the site's history "
               f"([sweep] db {config.sweep.db}), whose lemons it holds")
    else:
        try:
            count = publish_lemons(history, config, now)
            _progress(f"history: {count} lemon(s) written to {config.fleet.lemons_file}")
            return ""
        except UsageError as exc:
            why = str(exc)
    _progress(f"history: {why}")
    return why


def _same_file(path: Path, other: Path) -> bool:
    try:
        return os.path.samefile(path, other)
    except OSError:
        return False


@click.group("history")
def history():
    """The node history: sweeps, drains, and every job's verdicts on its nodes."""


@history.command("ingest")
@click.option("--site", required=True, help="Site name or .toml file: its name, [fleet] journal_dir and [sweep] db.")
@click.argument("paths", nargs=-1, type=click.Path())
@db_option
@json_option
def history_ingest(site, paths, db_path, as_json):
    """Fold jobs' journals into the history, once each: the site's [fleet] journal_dir and PATHS.

    A PATH is a journal, a directory of journals (*.jsonl), or a directory of job directories
    (trainctl-gate-*/journal.jsonl, e.g. a submit directory). A journal folded in before adds
    nothing; one that is damaged, from another site or from the future is refused with one
    line. Exit code: 0, or 1 if any journal was refused or the lemons file was not written.
    """
    from trainctl.errors import UsageError
    from trainctl.sweep.db import History

    config, _ = _load_site(site)
    if not (config.fleet.journal_dir or config.fleet.lemons_file or paths):
        raise UsageError(f"site {config.name!r} names no [fleet] journal_dir: name journals or directories to fold in")
    from trainctl.sweep.db import FLEET_TABLES

    with History.open(_db(db_path, config), write=True, judged=FLEET_TABLES) as opened:
        result, lemons_refused = _fold(opened, config, paths)
    if as_json:
        click.echo(json.dumps({"db": str(opened.path), "folded": result.folded, "events": result.events,
                               "unchanged": result.unchanged, "refused": result.refused,
                               "unverified": result.unverified, "uncounted": result.uncounted,
                               "no_accounting": result.no_accounting, "lemons_refused": lemons_refused}, indent=1))
    return 1 if result.refused or lemons_refused else 0


# ---------------------------------------------------------------- report

@click.command("report")
@click.option("--since", "since_text", default=DEFAULT_SINCE, show_default=True,
              help="Window of history to report: 7d, 36h, 2w, 90m.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown", "html"]), default="text",
              show_default=True, help="html is one self-contained file (inline CSS and SVG) to open or mail.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False),
              help="Write the report to this file (atomically) instead of stdout.")
@click.option("--prom", "prom_file", type=click.Path(dir_okay=False),
              help="Also write the latest status per node and check in Prometheus text format "
                   "(for node_exporter's textfile collector).")
@click.option("--site", help="Site whose [sweep] db to read.")
@db_option
def report(since_text, fmt, out_file, prom_file, site, db_path):
    """What is broken, how, and since when: failing checks grouped by check and reason.

    Nodes are folded into hostlists; each group says since when it has failed (the first
    sweep of the current streak) and whether it flaps. Also lists nodes that timed out or
    gave no verdict, nodes not swept with their Slurm state, and the nodes trainctl drained;
    per node, the jobs that left it out, the watch's detections, the sweeps it failed, the
    jobs it served and its strikes by failure family; and the lemons by the site's [fleet] rule
    (one failure family that recurs), with their evidence, and the nodes the jobs they served
    since cleared.
    Reads the history only; never changes it.
    """
    import time

    from trainctl.files import write_atomically
    from trainctl.site import FleetConfig
    from trainctl.sweep import render
    from trainctl.sweep.db import History
    from trainctl.sweep.fleet import LemonRule
    from trainctl.sweep.report import build_report, load_report_data

    config, _ = _load_site(site)
    now = time.time()
    since = now - parse_since(since_text)
    rule = LemonRule.from_site(config.fleet if config else FleetConfig())
    with History.open(_db(db_path, config), write=False) as history:
        built = build_report(load_report_data(history, since, rule, now), now, since)
        if prom_file:
            full = [s for s in history.sweeps() if s.kind == "sweep"]   # a resume's re-check is no sweep
            write_atomically(prom_file, render.to_prometheus(
                history.latest_checked_results(), history.current_nodes(1), history.drains(open_only=True),
                full[-1] if full else None, built.fleet))
    text = {"text": render.to_text, "json": render.to_json, "markdown": render.to_markdown,
            "html": render.to_html}[fmt](built)
    if out_file:
        write_atomically(out_file, text)
    else:
        click.echo(text, nl=False)


# ---------------------------------------------------------------- drain / resume

def _print_actions(actions, as_json: bool, applied: bool, extra: dict | None = None, breaker: str = "") -> None:
    from trainctl.text import printable  # host names and reasons come from the nodes

    if as_json:
        click.echo(json.dumps({"applied": applied, **(extra or {}), **({"breaker": breaker} if breaker else {}),
                               "actions": [{"host": a.host, "action": a.action, "text": a.text, "check": a.check}
                                           for a in actions]}, indent=1))
        return
    if not actions:
        click.echo("nothing to do")
    verb = {"drain": "drained" if applied else "would drain", "resume": "resumed" if applied else "would resume",
            "release": "released" if applied else "would release", "skip": "left alone",
            "recheck": "would re-check"}
    for action in actions:
        click.echo(printable(f"{action.host:<12} {verb.get(action.action, action.action):<15} {action.text}"))
    if breaker:
        click.echo(printable(breaker))


def _breaker_open(history, config) -> str:
    """For a plan: the line that says --apply would drain nothing while the breaker is open ("" when closed)."""
    from trainctl.sweep.breaker import Breaker, status

    now = status(history, Breaker.from_site(config), time.time())
    return (f"trainctl: breaker open, --apply would drain nothing ({now.open_since}); an admin closes it with "
            "`trainctl breaker reset`" if now.open_since else "")


def _apply_drains(path: Path, config, sweep_id: int, actions, rule: str, target: str):
    """(the actions as done, the breaker's line): the drains made within the site's breaker."""
    from trainctl.slurm import require_operator
    from trainctl.sweep.breaker import Breaker
    from trainctl.sweep.db import History
    from trainctl.sweep.drain import apply_drains

    breaker = Breaker.from_site(config)
    if rule not in breaker.shadow:
        require_operator()
    with History.open(path, write=True) as history:
        return apply_drains(history, sweep_id, actions, breaker, rule=rule, site=config.name if config else "",
                            target=target)


@click.command("drain")
@click.option("--apply", is_flag=True, help="Drain for real (needs Slurm operator rights). "
                                            "Without it, print what would be drained.")
@click.option("--sweep", "sweep_id", type=int, help="Drain from this sweep (default: the newest finished one).")
@click.option("--lemons", is_flag=True, help="Drain the lemons by the site's [fleet] rule instead of a sweep's "
                                              "failures, with reason `trainctl: fleet.lemon: ...`.")
@click.option("--site", help="Site whose [sweep] db (and, with --lemons, [fleet] rule) to use.")
@db_option
@json_option
def drain(apply, sweep_id, lemons, site, db_path, as_json):
    """Drain the nodes that failed the newest sweep, with reason `trainctl: <check>: <reason>`.

    Only nodes without any reason are drained: a node someone else drained, or that Slurm
    marked down with a reason, is left alone. Nodes that timed out or could not be judged
    are listed but never drained. Each drain is recorded in the history with the exact
    reason set, so `trainctl resume` can later tell trainctl's drains from everyone else's.
    With --lemons, the lemons are drained instead (same rules; resume keeps them drained
    while they are lemons). Every drain is made within the site's breaker ([breaker]): past
    its cap nothing more is drained, one line says so, until `trainctl breaker reset` closes it.
    """
    from trainctl.errors import UsageError
    from trainctl.slurm import node_states
    from trainctl.sweep.db import History
    from trainctl.sweep.drain import latest_sweep, plan_drains

    config, _ = _load_site(site)
    path = _db(db_path, config)
    if lemons:
        if sweep_id:
            raise UsageError("--lemons drains by the lemon rule, not from a sweep: leave out --sweep")
        return _drain_lemons(apply, config, path, as_json)
    with History.open(path, write=False) as history:
        sweeps = history.sweeps()
        chosen = next((s for s in sweeps if s.id == sweep_id), None) if sweep_id else latest_sweep(sweeps)
        if chosen is None:
            raise UsageError(f"{path}: no sweep #{sweep_id}" if sweep_id else f"{path}: no finished sweep yet")
        nodes, results = history.sweep_nodes(chosen.id), history.sweep_results(chosen.id)
        open_drains = history.drains(open_only=True)
        line = "" if apply else _breaker_open(history, config)
    newer = [s.id for s in sweeps if s.id > chosen.id and s.kind == "sweep"]
    if newer:
        _progress(f"draining from sweep #{chosen.id}, the newest that finished cleanly; newer sweeps "
                  f"that did not: {', '.join(f'#{i}' for i in newer)}")
    states = node_states(nodes=[n.host for n in nodes]) if nodes else {}
    actions = plan_drains(nodes, results, states, open_drains)
    if apply and any(a.action == "drain" for a in actions):
        actions, line = _apply_drains(path, config, chosen.id, actions, "sweep", f"sweep #{chosen.id}")
    _print_actions(actions, as_json, apply, {"sweep": chosen.id}, line)


def _drain_lemons(apply: bool, config, path: Path, as_json: bool) -> None:
    from trainctl.site import FleetConfig
    from trainctl.slurm import node_states
    from trainctl.sweep.db import History
    from trainctl.sweep.drain import LEMON_SWEEP, plan_lemon_drains
    from trainctl.sweep.fleet import LemonRule, current_lemons

    rule = LemonRule.from_site(config.fleet if config else FleetConfig())
    with History.open(path, write=False) as history:
        found = current_lemons(history, rule, time.time())
        open_drains = history.drains(open_only=True)
        line = "" if apply else _breaker_open(history, config)
    states = node_states(nodes=[lemon.host for lemon in found]) if found else {}
    actions = plan_lemon_drains(found, rule, states, open_drains)
    if apply and any(a.action == "drain" for a in actions):
        actions, line = _apply_drains(path, config, LEMON_SWEEP, actions, "lemons", "lemons")
    _print_actions(actions, as_json, apply, {"lemons": [lemon.host for lemon in found], "rule": rule.describe()},
                   line)


@click.group("breaker")
def breaker():
    """The cap on trainctl's automatic drains: its state, and the reset that closes it.

    Every automatic drain (the gate's and the watch's `[gate] drain_on`, `trainctl drain`,
    `trainctl drain --lemons`) is counted in the sweep history. Past the site's [breaker]
    max_drains in window_s, or max_share of a partition held drained, the breaker trips and
    trainctl drains nothing more until an admin resets it.
    """


@breaker.command("status")
@click.option("--site", help="Site whose [breaker] and [sweep] db to use.")
@db_option
@json_option
def breaker_status(site, db_path, as_json):
    """Whether the breaker is open, and the drains counted in its window."""
    from trainctl.sweep.breaker import Breaker, status
    from trainctl.sweep.db import History
    from trainctl.text import printable

    config, _ = _load_site(site)
    rule = Breaker.from_site(config)
    with History.open(_db(db_path, config), write=False) as history:
        now = status(history, rule, time.time())
    if as_json:
        click.echo(json.dumps({"open": bool(now.open_since), "tripped": now.open_since,
                               "tripped_at": now.tripped_at or None,
                               "window_drains": now.window_drains, "max_drains": rule.max_drains,
                               "window_s": rule.window_s, "max_share": rule.max_share, "shadow": list(rule.shadow),
                               "reset_at": now.reset_at or None}, indent=1))
        return
    for text in now.lines(rule):
        click.echo(printable(text))


@breaker.command("reset")
@click.option("--site", help="Site whose [sweep] db to use.")
@db_option
def breaker_reset(site, db_path):
    """Close the breaker: automatic drains start again, counted from now (needs write access to the history)."""
    import getpass

    from trainctl.sweep.breaker import reset
    from trainctl.sweep.db import History

    config, _ = _load_site(site)
    path = _db(db_path, config)
    with History.open(path, write=True) as history:
        try:
            by = getpass.getuser()
        except (KeyError, OSError):   # a uid without a passwd entry (containers)
            import os
            by = f"uid {os.geteuid()}"
        reset(history, site=config.name if config else "", by=by, now=time.time())
    click.echo(f"breaker closed in {path}: automatic drains count from now")


@click.command("resume")
@click.option("--apply", is_flag=True, help="Resume for real (needs Slurm operator rights). "
                                            "Without it, re-check and print what would be resumed.")
@click.option("--site", required=True, help="Site name or .toml file (checks and SSH access for the re-check).")
@click.option("--timeout", "timeout_s", type=Number(float, Bounds(1, DAY_S)),
              help="Seconds a node's re-check may take (default: site).")
@db_option
@json_option
def resume(apply, site, timeout_s, db_path, as_json):
    """Resume only what trainctl drained, if it is still trainctl's drain and the node passes now.

    A node qualifies only if trainctl recorded draining it and Slurm still shows exactly that
    reason with that timestamp. Those nodes are re-checked over SSH (a drained node runs no
    Slurm job) and resumed if they pass. A node drained by anyone else is never considered;
    a trainctl drain whose reason someone changed is let go and never resumed.
    """
    from trainctl.slurm import node_states, require_operator
    from trainctl.sweep.db import History
    from trainctl.sweep.drain import RECHECK, apply_resumes, decide_resumes, plan_resumes
    from trainctl.sweep.runner import SweepRequest, run_sweep

    config, given_site = _load_site(site, runs_checks=True)
    path = _db(db_path, config)
    from trainctl.sweep.drain import LEMON_CHECK, keep_lemons_drained
    from trainctl.sweep.fleet import LemonRule, current_lemons

    rule = LemonRule.from_site(config.fleet)
    with History.open(path, write=False) as history:
        open_drains = history.drains(open_only=True)
        lemons = ({lemon.host for lemon in current_lemons(history, rule, time.time())}
                  if any(d.check == LEMON_CHECK for d in open_drains) else set())
    states = node_states(nodes=[d.host for d in open_drains]) if open_drains else {}
    planned = plan_resumes(open_drains, states)
    candidates, kept = keep_lemons_drained([a for a in planned if a.action == RECHECK], lemons, rule)
    planned = [a for a in planned if a.action != RECHECK] + kept + candidates
    if apply and planned:
        require_operator()
    rechecked = {}
    recheck_id = None
    if candidates:
        request = SweepRequest(kind="recheck", site=given_site, via="ssh", partition=None,
                               nodes=[a.host for a in candidates],
                               command=_node_command(config, given_site, None, timeout_s, False), gpu_args=[],
                               access=_ssh_access(config), fanout=config.sweep.fanout)
        if apply:
            with History.open(path, write=True) as history:
                result = run_sweep(request, history, _progress)
            recheck_id = result.sweep_id
        else:
            result = run_sweep(request, None, _progress)
        rechecked = result.nodes
    actions = [a for a in planned if a.action != RECHECK] + decide_resumes(candidates, rechecked)
    if apply:
        with History.open(path, write=True) as history:
            actions = apply_resumes(history, actions)
    _print_actions(actions, as_json, apply, {"recheck_sweep": recheck_id})
