"""The supervisor's side of the watch's files, in the job directory's `watch/` folder
(`trainctl.job.jobdir` names and reads them): the node agents' files read back, the request for
every rank's stack, and the earlier gate rounds kept.

Each node agent (`trainctl job agent`, `trainctl.job.agent`) rewrites `watch/<node>.json`
atomically; the supervisor reads them here every poll. A file that is missing, torn, foreign or
not a regular file reads as None: the detectors then treat that node's agent as silent once it
has been so for the site's `watch.agent_silence_s`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from trainctl.errors import UsageError
from trainctl.files import open_directory, replace_in
from trainctl.job import jobdir
from trainctl.job.jobdir import CHECKPOINT_LISTENING, SIGNAL_REFUSED, JobPaths, NodeReading

TOKEN_BYTES = 64


RANKS_SAY = (CHECKPOINT_LISTENING, SIGNAL_REFUSED)


def prepare_watch_dir(gate_dir: str) -> str:
    """`watch/`, emptied of an earlier training step's node files, stack requests and what its
    ranks said of themselves (a listener, a signal refusal): the new step's ranks say it again.
    UsageError where `watch/` is a symlink or no directory: nothing is removed through it."""
    path = JobPaths(Path(gate_dir)).watch
    with _watch_folder(path) as folder:
        for name in os.listdir(folder):
            if name.endswith(".json") or name.startswith(("dump-", "stacks-")) or name in RANKS_SAY:
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    os.unlink(name, dir_fd=folder)
    return str(path)


@contextlib.contextmanager
def _watch_folder(path: Path) -> Iterator[int]:
    """A descriptor of `watch/` itself (made when missing), never of what a symlink there points to."""
    try:
        os.makedirs(path, exist_ok=True)
        folder = open_directory(path)
    except OSError as exc:   # a symlink (ELOOP, or EEXIST when it dangles), a file in its place
        what = "is a symbolic link" if path.is_symlink() else f"cannot be used: {exc.strerror or exc}"
        raise UsageError(f"the watch folder {path} {what}: remove it") from None
    try:
        yield folder
    finally:
        os.close(folder)


def read_node_files(gate_dir: str, nodes: tuple[str, ...]) -> dict[str, NodeReading | None]:
    return jobdir.read_node_files(JobPaths(Path(gate_dir)), nodes)


def post_request(gate_dir: str, name: str) -> str:
    """A new token in the watch folder's request file `name`, for every node's agent to see; the
    token. Written whole, as a new file renamed over the name (`trainctl.files.replace_in`): a FIFO
    or a symlink put there is replaced, never written into. UsageError where it cannot be written."""
    token = secrets.token_hex(8)
    path = JobPaths(Path(gate_dir)).watch
    with _watch_folder(path) as folder:
        try:
            replace_in(folder, name, token + "\n", mode=0o644)
        except OSError as exc:   # a full disk; a directory at `name`
            raise UsageError(f"cannot write {path / name}: {exc.strerror or exc}") from None
    return token


def request_stacks(gate_dir: str, nodes: tuple[str, ...], wait_s: float) -> dict[str, str]:
    """Ask every node's agent for its ranks' stacks (py-spy dump) and wait up to `wait_s` for
    the answers; {node: its stacks file, or why there is none}."""
    paths = JobPaths(Path(gate_dir))
    token = post_request(gate_dir, jobdir.DUMP_REQUEST)
    deadline = time.monotonic() + wait_s
    answered: set[str] = set()
    while True:
        for node in nodes:
            done = paths.watch / jobdir.dump_done_file(node)
            if node not in answered and jobdir.read_token(done, TOKEN_BYTES, root=paths.root) == token:
                answered.add(node)
        if len(answered) == len(nodes) or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    return {node: (str(paths.watch / jobdir.stacks_file(node)) if node in answered
                   else f"no answer from its agent within {wait_s:g} s") for node in nodes}


def archive_gate_round(gate_dir: str, number: int) -> str:
    """Move the last gate round's files, and the watch's evidence from the training that followed
    it (node files, stacks), into `rounds/<number>/` before the gate runs again."""
    paths = JobPaths(Path(gate_dir))
    target = paths.round(number)
    (target / jobdir.WATCH).mkdir(parents=True, exist_ok=True)
    for name in jobdir.GATE_ROUND_FILES:
        source = paths.root / name
        if source.exists():
            shutil.move(str(source), str(target / name))
    for log in paths.root.glob(jobdir.gate_log("*")):
        shutil.move(str(log), str(target / log.name))
    for evidence in [*paths.watch.glob("*.json"), *paths.watch.glob(jobdir.stacks_file("*"))]:
        shutil.move(str(evidence), str(target / jobdir.WATCH / evidence.name))
    return str(target)
