"""The supervisor's side of the watch's files, in the gate directory's `watch/` folder: the node
agents' files read back, the request for every rank's stack, and the earlier gate rounds kept.

Each node agent (`trainctl job agent`, `trainctl.job.agent`) rewrites `watch/<node>.json`
atomically; the supervisor reads them here every poll. A file that is missing, torn or
foreign reads as None: the detectors then treat that node's agent as silent once it has been
so for the site's `watch.agent_silence_s`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from pathlib import Path

from trainctl.job.watch import (DUMP_REQUEST, WATCH_SUBDIR, NodeReading, dump_done_file, parse_node_file,
                                 stacks_file, watch_dir)

NODE_FILE_MAX_BYTES = 1 << 20               # a node file with thousands of ranks is still far below
# what a gate round writes in the gate directory (job/gate_cli.py, the gate step's per-node logs)
GATE_ROUND_FILES = ("nodes", "snapshots", "compute", "fabric.json", "decision.json", "report.txt", "gate-step.status")


def prepare_watch_dir(gate_dir: str) -> str:
    """`watch/`, emptied of an earlier training step's node files and stack requests."""
    path = watch_dir(gate_dir)
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):
        if name.endswith(".json") or name.startswith(("dump-", "stacks-")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(path, name))
    return str(path)


def read_node_files(gate_dir: str, nodes: tuple[str, ...]) -> dict[str, NodeReading | None]:
    readings: dict[str, NodeReading | None] = {}
    for node in nodes:
        try:
            with open(os.path.join(watch_dir(gate_dir), f"{node}.json"), "rb") as handle:
                text = handle.read(NODE_FILE_MAX_BYTES).decode("utf-8", "replace")
        except OSError:
            readings[node] = None
            continue
        reading = parse_node_file(text)
        readings[node] = reading if reading is not None and reading.node == node else None
    return readings


def request_stacks(gate_dir: str, nodes: tuple[str, ...], wait_s: float) -> dict[str, str]:
    """Ask every node's agent for its ranks' stacks (py-spy dump) and wait up to `wait_s` for
    the answers; {node: its stacks file, or why there is none}."""
    from trainctl.files import write_atomically

    folder = watch_dir(gate_dir)
    token = secrets.token_hex(8)
    write_atomically(os.path.join(folder, DUMP_REQUEST), token + "\n")
    deadline = time.monotonic() + wait_s
    answered: set[str] = set()
    while True:
        for node in nodes:
            if node not in answered and _read(os.path.join(folder, dump_done_file(node))) == token:
                answered.add(node)
        if len(answered) == len(nodes) or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    return {node: (os.path.join(folder, stacks_file(node)) if node in answered
                   else f"no answer from its agent within {wait_s:g} s") for node in nodes}


def archive_gate_round(gate_dir: str, number: int) -> str:
    """Move the last gate round's files, and the watch's evidence from the training that followed
    it (node files, stacks), into `rounds/<number>/` before the gate runs again."""
    target = Path(gate_dir, "rounds", str(number))
    (target / WATCH_SUBDIR).mkdir(parents=True, exist_ok=True)
    for name in GATE_ROUND_FILES:
        source = Path(gate_dir, name)
        if source.exists():
            shutil.move(str(source), str(target / name))
    for log in Path(gate_dir).glob("node-*.log"):
        shutil.move(str(log), str(target / log.name))
    for evidence in [*watch_dir(gate_dir).glob("*.json"), *watch_dir(gate_dir).glob("stacks-*.txt")]:
        shutil.move(str(evidence), str(target / WATCH_SUBDIR / evidence.name))
    return str(target)


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read(64).strip()
    except OSError:
        return None
