"""Run the node task on many nodes and parse what comes back: through one Slurm job, or over SSH.

Both collectors yield one `NodeOutcome` per node as soon as it is known, so the sweep can
commit it at once: a sweep killed half-way keeps what it had. A node that outruns its
deadline is a TIMEOUT, a node that answered with no verdict an ERROR; neither is a failing check.
"""

from __future__ import annotations

import base64
import json
import math
import queue
import shlex
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trainctl.errors import ExternalCommandError, TrainctlError
from trainctl.proc import POLL_S, SIGNAL_POLL_S, RunGroup, StreamedRun
from trainctl.slurm import fold_hostlist
from trainctl.ssh import Cutoff, connect, run_remote
from trainctl.sweep.model import CHECKED, ERROR, STATUSES, TIMEOUT, CheckRow, NodeOutcome

JOB_NAME = "trainctl-sweep"
ALLOCATION_WAIT_S = 60     # srun --immediate: give up if the idle nodes were taken meanwhile
STARTUP_MARGIN_S = 30.0    # Python and trainctl start-up on a node, on top of the checks' deadline
STDERR_TAIL_CHARS = 400


@dataclass(frozen=True)
class NodeCommand:
    """The node task's command line: which Python, which site and checks, which deadlines."""

    python: str
    site: str
    partition: str | None             # the site partition whose expectations apply
    only: tuple[str, ...]             # check names or families
    timeout_s: float
    fabric_timeout_s: float | None = None

    def argv(self) -> list[str]:
        argv = [self.python, "-m", "trainctl.sweep.node_task", "--timeout", f"{self.timeout_s:g}",
                "--site", self.site, "--only", ",".join(self.only)]
        if self.partition:
            argv += ["--partition", self.partition]
        if self.fabric_timeout_s:
            argv += ["--fabric-timeout", f"{self.fabric_timeout_s:g}"]
        return argv

    @property
    def deadline_s(self) -> float:
        return self.timeout_s + (self.fabric_timeout_s or 0) + STARTUP_MARGIN_S


@dataclass(frozen=True)
class FabricVerdict:
    """Rank 0's `health fabric --json` envelope (or why there is none)."""

    outcome: str
    report: dict | None
    detail: str


# ---------------------------------------------------------------- parsing (pure)

def outcome_from_envelope(host: str, envelope: dict, slurm_state: str = "") -> NodeOutcome:
    """The node task's envelope as a NodeOutcome; anything malformed is an ERROR, never a crash."""
    outcome = envelope.get("outcome")
    duration = envelope.get("duration_s") if isinstance(envelope.get("duration_s"), (int, float)) else None
    if outcome == TIMEOUT:
        return NodeOutcome(host, TIMEOUT, slurm_state=slurm_state, detail=str(envelope.get("detail", "")),
                           duration_s=duration)
    report = envelope.get("report")
    if outcome != CHECKED or not isinstance(report, dict):
        detail = str(envelope.get("detail") or f"unexpected answer from the node task: {envelope!r:.200}")
        return NodeOutcome(host, ERROR, slurm_state=slurm_state, detail=detail, duration_s=duration)
    checks = tuple(_check_row(item) for item in report.get("checks") or [] if isinstance(item, dict))
    status = report.get("status") if report.get("status") in STATUSES else "unknown"
    if report.get("host") not in (None, host):
        detail = f"the node calls itself {report['host']}"
    else:
        detail = ""
    return NodeOutcome(host, CHECKED, status=status, slurm_state=slurm_state, detail=detail,
                       duration_s=duration, checks=checks)


def _check_row(item: dict) -> CheckRow:
    status = item.get("status") if item.get("status") in STATUSES else "unknown"
    details = item.get("details") if isinstance(item.get("details"), dict) else {}
    return CheckRow(str(item.get("name", "?")), status, str(item.get("reason", "")), details)


class Reassembler:
    """Joins the node task's pieces (see `sweep.node_task.emit`) back into envelopes.

    Pieces of different nodes arrive interleaved; anything that is not a piece (a stray
    line a task printed) is ignored, and a damaged envelope is dropped, never raised. A node
    whose unfinished envelopes hold more than `NODE_PENDING_CAP` chars (a task flooding
    pieces that never complete) loses them, so memory stays bounded per node.
    """

    def __init__(self) -> None:
        self._pieces: dict[tuple[str, int], dict[int, str]] = {}
        self._pending: dict[str, int] = {}

    def feed(self, line: str) -> dict | None:
        """The envelope this line completes, else None."""
        piece = _piece(line)
        if piece is None:
            return None
        node = piece["node"]
        key = (node, piece["msg"])
        got = self._pieces.setdefault(key, {})
        self._pending[node] = self._pending.get(node, 0) + len(piece["data"]) - len(got.get(piece["part"], ""))
        got[piece["part"]] = piece["data"]
        if self._pending[node] > NODE_PENDING_CAP:
            self._drop(node)
            return None
        if len(got) < piece["parts"]:
            return None
        del self._pieces[key]
        self._pending[node] -= sum(map(len, got.values()))
        try:
            data = "".join(got[i] for i in range(piece["parts"]))
            envelope = json.loads(zlib.decompress(base64.b64decode(data, validate=True)))
        except (KeyError, ValueError, zlib.error):
            return None
        return envelope if isinstance(envelope, dict) and envelope.get("node") == piece["node"] else None


    def _drop(self, node: str) -> None:
        for key in [key for key in self._pieces if key[0] == node]:
            del self._pieces[key]
        self._pending[node] = 0


NODE_PENDING_CAP = 16 << 20  # chars of one node's unfinished envelopes (a real one is a few KB)


def _piece(line: str) -> dict | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if not (isinstance(value, dict) and isinstance(value.get("node"), str) and isinstance(value.get("data"), str)
            and all(isinstance(value.get(k), int) for k in ("msg", "part", "parts"))):
        return None
    return value if 0 <= value["part"] < value["parts"] else None


# ---------------------------------------------------------------- Slurm

def gpu_request_args(gpu_request: str, gpus_per_node: int) -> list[str]:
    """The job's GPU request in the site's dialect, so the checks see every GPU of the node."""
    if gpus_per_node <= 0 or gpu_request == "none":
        return []
    if gpu_request == "gres":
        return [f"--gres=gpu:{gpus_per_node}"]
    return [f"--gpus-per-node={gpus_per_node}"]


def srun_argv(nodes: list[str], command: NodeCommand, *, partition: str | None,
              extra: list[str]) -> list[str]:
    """One job, one step, one task per node, whole nodes, no task's failure ending the others."""
    minutes = math.ceil((command.deadline_s + ALLOCATION_WAIT_S) / 60)
    argv = ["srun", f"--job-name={JOB_NAME}", f"--nodelist={fold_hostlist(nodes)}", f"--nodes={len(nodes)}",
            "--ntasks-per-node=1", "--exclusive", "--kill-on-bad-exit=0", f"--immediate={ALLOCATION_WAIT_S}",
            f"--time={minutes}"]
    if partition:
        argv.append(f"--partition={partition}")
    return [*argv, *extra, *command.argv()]


def collect_via_slurm(nodes: list[str], command: NodeCommand, *, partition: str | None,
                      extra: list[str], states: dict[str, str],
                      on_job: Callable[[str], None] = lambda job_id: None,
                      env: dict[str, str] | None = None) -> Iterator[NodeOutcome | FabricVerdict]:
    """Run the node task on `nodes` with srun; yield each node's outcome as its line arrives.

    Nodes with no line by the end timed out (srun killed at the deadline) or, when srun
    itself failed (no allocation, say), are ERRORs carrying srun's message.
    """
    argv = srun_argv(nodes, command, partition=partition, extra=extra)
    deadline_s = command.deadline_s + ALLOCATION_WAIT_S
    seen: set[str] = set()
    job_reported = False
    pieces = Reassembler()
    with StreamedRun(argv, deadline_s, env) as stream:
        for line in stream.lines():
            envelope = pieces.feed(line)
            if envelope is None or envelope["node"] not in nodes:
                continue
            if not job_reported and envelope.get("job_id"):
                on_job(str(envelope["job_id"]))
                job_reported = True
            if "fabric" in envelope:
                verdict = envelope["fabric"] if isinstance(envelope["fabric"], dict) else {}
                yield FabricVerdict(str(verdict.get("outcome")), verdict.get("report"), str(verdict.get("detail", "")))
            elif envelope["node"] not in seen:
                seen.add(envelope["node"])
                yield outcome_from_envelope(envelope["node"], envelope, states.get(envelope["node"], ""))
    for host in nodes:
        if host in seen:
            continue
        if stream.timed_out:
            yield NodeOutcome(host, TIMEOUT, slurm_state=states.get(host, ""),
                              detail=f"no answer within {deadline_s:g} s (srun stopped)")
        else:
            yield NodeOutcome(host, ERROR, slurm_state=states.get(host, ""),
                              detail=f"no answer from the node: {stream.failure()}")
    if not seen and not stream.timed_out and stream.failed:
        # Not one node answered and srun failed: Slurm itself is the problem (exit 4), after
        # every node is recorded with srun's message.
        raise ExternalCommandError(f"sweep job failed: {stream.failure()}")


# ---------------------------------------------------------------- SSH

@dataclass(frozen=True)
class SshAccess:
    user: str
    port: int
    key_path: str          # "" : ssh-agent and ~/.ssh/id_*
    known_hosts: str       # "" : ~/.ssh/known_hosts

    @property
    def known_hosts_path(self) -> Path:
        return Path(self.known_hosts or "~/.ssh/known_hosts").expanduser()


def collect_via_ssh(addresses: dict[str, str], command: NodeCommand, access: SshAccess, *, fanout: int,
                    states: dict[str, str]) -> Iterator[NodeOutcome]:
    """Run the node task on each host (at its address) over SSH, `fanout` at a time.

    Each node has one deadline for all of it: connect, handshake, the task and its output
    (`trainctl.ssh.Cutoff`). A stop signal, or the consumer stopping, cuts every session at
    once and starts no more. The workers are daemon threads, so one stuck where no cut reaches
    (a DNS lookup) cannot hold the process on its way out.
    """
    group = RunGroup()
    todo: queue.SimpleQueue[str] = queue.SimpleQueue()
    for host in addresses:
        todo.put(host)
    done: queue.SimpleQueue[NodeOutcome] = queue.SimpleQueue()

    def work() -> None:
        while not group.aborted:
            try:
                host = todo.get_nowait()
            except queue.Empty:
                return
            try:
                outcome = ssh_node(host, addresses[host], command, access, states.get(host, ""), group)
            except Exception as exc:  # one node's surprise is that node's recorded error; the sweep goes on
                outcome = NodeOutcome(host, ERROR, slurm_state=states.get(host, ""),
                                      detail=f"ssh {access.user}@{addresses[host]}:{access.port}: "
                                             f"{type(exc).__name__}: {exc}")
            done.put(outcome)

    workers = [threading.Thread(target=work, name=f"ssh-sweep-{n}", daemon=True)
               for n in range(min(max(1, fanout), len(addresses)))]
    for worker in workers:
        worker.start()
    try:
        for _ in addresses:
            # Short waits on a C queue: a stop signal is raised here within SIGNAL_POLL_S.
            while True:
                try:
                    outcome = done.get(timeout=SIGNAL_POLL_S)
                    break
                except queue.Empty:
                    continue
            yield outcome
    finally:
        group.abort()   # nothing is in flight after the last node; after a stop signal, every session
        for worker in workers:
            worker.join(timeout=POLL_S)


def ssh_node(host: str, address: str, command: NodeCommand, access: SshAccess, slurm_state: str,
             group: RunGroup | None = None) -> NodeOutcome:
    """One node over SSH; the host key must be in known_hosts (never added, never skipped)."""
    import paramiko  # only SSH sweeps pay for importing it

    started = time.monotonic()

    def failed(outcome: str, detail: str) -> NodeOutcome:
        return NodeOutcome(host, outcome, slurm_state=slurm_state, detail=detail,
                           duration_s=round(time.monotonic() - started, 3))

    target = f"{access.user}@{address}:{access.port}"

    def cut_short(cutoff: Cutoff) -> NodeOutcome:
        if cutoff.expired:
            return failed(TIMEOUT, f"no answer over SSH within {command.deadline_s:g} s ({target})")
        return failed(ERROR, f"ssh {target}: stopped, trainctl was interrupted")

    with Cutoff(command.deadline_s, group) as cutoff:
        try:
            client = connect(access.user, address, access.port, identity=access.key_path or None,
                             known_hosts=str(access.known_hosts_path), cutoff=cutoff)
        except TrainctlError as exc:  # unknown or changed host key, no key, unreachable: no verdict
            return cut_short(cutoff) if cutoff.stopped else failed(ERROR, f"ssh {target}: {exc}")
        try:
            result = run_remote(client, shlex.join(command.argv()), cutoff)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            return cut_short(cutoff) if cutoff.stopped else failed(ERROR, f"ssh {target}: {exc or 'connection closed'}")
        finally:
            client.close()
    if result.cut_short:
        return cut_short(cutoff)
    pieces = Reassembler()
    envelopes = [e for e in map(pieces.feed, result.stdout.splitlines()) if e is not None]
    if not envelopes:
        tail = result.stderr.strip()[-STDERR_TAIL_CHARS:]
        cut = f" ({result.stdout_bytes} bytes of output, cut to its head and tail)" if result.truncated else ""
        return failed(ERROR, f"ssh {target}: remote command exited with status {result.exit_status} and no "
                             f"verdict{cut}" + (f": {tail}" if tail else ""))
    return outcome_from_envelope(host, envelopes[0], slurm_state)
