"""Stand-ins for Slurm's commands (srun, scontrol, scancel, sbatch, squeue, sinfo), run as real
processes from a folder put first on a PATH, for the tests of the job's executors
(tests/test_job_executors.py).

Each command is a small executable written at test time (`#!` this Python) that runs `main`
below with its own name. It appends its argv to `calls.jsonl` (one JSON line per call), keeps
what Slurm would keep in `state.json` (the job's nodes, its steps and their processes, the
nodes' drain reasons), and prints only what the real command printed on this project's dev
cluster (Slurm 22.05.8), read from the recordings under tests/fixtures/recorded/ with the
values of the test's job put in:

- `srun`: registers the step (squeue lists it; scancel ends it), then becomes its one task (the
  first node's, or --relative's): the step's program, or the argv the test gave for steps of that
  name, with the task's SLURM_* variables (SLURM_STEP_NODELIST: all the step's nodes);
  `--output=` is honoured (%N %j %s %t %n %%), `--open-mode=append` too.
- `scontrol`: `--version`, `show config`, `show job -o`, `show node -o`, `update JobId= NodeList=`
  (writes slurm_job_<id>_resize.sh and .csh in its working directory, as update_job.c's
  _update_job_size does: only inside a job (SLURM_JOBID), each variable only where the caller's
  environment has it),
  `update JobId= Comment=`, `update NodeName= State=DRAIN|RESUME Reason=`.
- `sinfo -h -N -o` with the two formats trainctl uses (trainctl.slurm SINFO_FORMAT, PARTITION_FORMAT).
- `squeue --noheader --steps --jobs= --format=%i %j`: the job's live steps and its batch step.
- `scancel [--quiet] ID`: a step's task gets SIGTERM; a job id is recorded only.
- `sbatch --parsable`: keeps the script from stdin and prints the next job id.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import sys
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
SLURM_22 = RECORDED / "devcluster-slurm-22.05.8"
SLURM_26 = RECORDED / "devcluster-slurm-26.05.5"
COMMANDS = ("srun", "scontrol", "scancel", "sbatch", "squeue", "sinfo")
PARTITION = "gpu"    # the dev cluster's one partition (sinfo-partitions.txt)


class Standins:
    """The stand-ins' folder and what they recorded."""

    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"

    @property
    def path(self) -> str:
        """A PATH with the stand-ins first."""
        return f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"

    def calls(self, command: str | None = None) -> list[list[str]]:
        """Every call's argv (command name first), in order; only `command`'s if given."""
        log = self.root / "calls.jsonl"
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return [argv for argv in calls if command is None or argv[0] == command]

    def state(self) -> dict:
        return json.loads((self.root / "state.json").read_text())

    def submitted(self) -> list[dict]:
        """Each sbatch: its argv, the script it read, its job id."""
        return self.state()["submitted"]

    def step(self, name: str) -> dict | None:
        """The newest step of that name ({"id", "name", "pid", "started", "argv"})."""
        return next((step for step in reversed(self.state()["steps"]) if step["name"] == name), None)

    def end_steps(self) -> None:
        """SIGKILL to every step's task still running (a sentinel a test left, say)."""
        for step in self.state()["steps"]:
            if running(step):
                os.kill(step["pid"], signal.SIGKILL)


def install(root: Path, *, job_id: str, nodes: list[str], job_name: str = "job.sh",
            tasks: dict[str, list[str]] | None = None, next_job_id: str = "") -> Standins:
    """The stand-ins in `root`/bin, for job `job_id` running on `nodes`; `tasks`: for steps of
    these names (srun --job-name), run this argv instead of the step's program (a gate step
    whose node reports the test wrote, say)."""
    standins = Standins(root)
    standins.bin.mkdir(parents=True, exist_ok=True)
    state = {"job_id": job_id, "job_name": job_name, "nodes": nodes, "steps": [], "reasons": {},
             "tasks": tasks or {}, "next_job_id": next_job_id or str(int(job_id) + 1), "submitted": []}
    (root / "state.json").write_text(json.dumps(state))
    support = Path(__file__).resolve().parent
    for command in COMMANDS:
        script = standins.bin / command
        script.write_text(f"#!{sys.executable}\n"
                          "import sys\n"
                          f"sys.path.insert(0, {str(support)!r})\n"
                          "from slurm_standins import main\n"
                          f"main({command!r}, {str(root)!r})\n")
        script.chmod(0o755)
    return standins


# ---------------------------------------------------------------- the commands

def main(command: str, root: str) -> None:
    base = Path(root)
    with open(base / "calls.jsonl", "a") as log:   # one write per call: lines never interleave
        log.write(json.dumps([command, *sys.argv[1:]]) + "\n")
    sys.exit(COMMANDS_RUN[command](base, sys.argv[1:]))


@contextmanager
def _locked_state(root: Path):
    """state.json, read and written back under a lock: steps start concurrently."""
    with open(root / "state.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.loads((root / "state.json").read_text())
        yield state
        (root / "state.json").write_text(json.dumps(state))


def _state(root: Path) -> dict:
    with open(root / "state.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        return json.loads((root / "state.json").read_text())


def _options(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """srun's and sbatch's `--name=value` / `--flag` options, and what follows them."""
    options: dict[str, str] = {}
    at = 0
    while at < len(args) and args[at].startswith("-"):
        name, _, value = args[at].partition("=")
        options[name] = value
        at += 1
    return options, args[at:]


def _expand(hostlist: str) -> list[str]:
    from trainctl.slurm import expand_hostlist
    return expand_hostlist(hostlist)


def _process(pid: int) -> tuple[str, str]:
    """(state, start time) of a process from /proc/PID/stat; ("", "") when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return "", ""
    return fields[0], fields[19]   # proc(5): state is field 3, starttime field 22


def running(step: dict) -> bool:
    """The step's task still runs: its process, not another that took its PID since, and not a
    zombie its parent has yet to reap."""
    state, started = _process(step["pid"])
    return state not in ("", "Z") and started == step["started"]


def srun(root: Path, args: list[str]) -> int:
    options, program = _options(args)
    with _locked_state(root) as state:
        number = len(state["steps"])
        step_id = f"{state['job_id']}.{number}"
        name = options.get("--job-name") or os.path.basename(program[0])
        state["steps"].append({"id": step_id, "name": name, "pid": os.getpid(),
                               "started": _process(os.getpid())[1], "argv": args})
        held = state["nodes"]
        task = state["tasks"].get(name) or program
    nodes = _expand(options["--nodelist"]) if options.get("--nodelist") else held
    node = nodes[int(options.get("--relative", "0"))]
    from trainctl.slurm import fold_hostlist
    env = dict(os.environ, SLURM_STEP_ID=str(number), SLURM_STEPID=str(number), SLURM_PROCID="0",
               SLURM_STEP_NODELIST=fold_hostlist(nodes), SLURM_STEP_NUM_NODES=str(len(nodes)),
               SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_NTASKS="1", SLURM_TASKS_PER_NODE="1",
               SLURM_STEP_NUM_TASKS="1", SLURM_STEP_TASKS_PER_NODE="1", SLURMD_NODENAME=node)
    output = options.get("--output")
    if output:
        names = {"%%": "%", "%N": node, "%j": env.get("SLURM_JOB_ID", ""), "%s": str(number), "%t": "0", "%n": "0"}
        path = re.sub(r"%[%Njstn]", lambda m: names[m.group()], output)
        append = options.get("--open-mode") == "append"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    os.execvpe(task[0], task, env)   # the step's one task is this process: srun's signals reach it


def scontrol(root: Path, args: list[str]) -> int:
    if args == ["--version"]:
        sys.stdout.write((SLURM_22 / "scontrol-version.txt").read_text())
        return 0
    if args == ["show", "config"]:
        sys.stdout.write((SLURM_22 / "scontrol-show-config.txt").read_text())
        return 0
    state = _state(root)
    if args[:3] == ["show", "job", "-o"]:
        return _show_job(state, args[3])
    if args[:3] == ["show", "node", "-o"]:
        return _show_nodes(state, _expand(args[3]))
    if args[:1] == ["update"] and args[1].startswith("JobId=") and args[2].startswith("NodeList="):
        return _resize(root, args[1].partition("=")[2], args[2].partition("=")[2])
    if args[:1] == ["update"] and args[1].startswith("JobId=") and args[2].startswith("Comment="):
        return 0
    if args[:1] == ["update"] and args[1].startswith("NodeName="):
        settings = dict(arg.partition("=")[::2] for arg in args[2:])
        return _update_nodes(root, _expand(args[1].partition("=")[2]), settings)
    print(f"scontrol stand-in: not recorded: {args}", file=sys.stderr)
    return 1


def _with_values(record: str, values: dict[str, str]) -> str:
    """A recorded one-line record with these keys' values put in."""
    for key, value in values.items():
        record = re.sub(rf"(?<![A-Za-z/]){re.escape(key)}=\S*", lambda _: f"{key}={value}", record)
    return record


def _show_job(state: dict, job_id: str) -> int:
    from trainctl.slurm import fold_hostlist
    if job_id != state["job_id"]:
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        return 1
    record = (SLURM_26 / "scontrol-show-job.txt").read_text().strip()
    print(_with_values(record, {"JobId": job_id, "JobName": state["job_name"],
                                "NodeList": fold_hostlist(state["nodes"]), "BatchHost": state["nodes"][0],
                                "NumNodes": str(len(state["nodes"]))}))
    return 0


def node_address(node: str) -> str:
    """The address the stand-in's Slurm gives a node: the dev cluster's (instance 2, as in sinfo-states.txt)."""
    return f"10.77.2.{int(re.sub(r'[^0-9]', '', node) or 0)}"


def _show_nodes(state: dict, nodes: list[str]) -> int:
    record = (SLURM_22 / "scontrol-show-node-o-fqdn-nodehostname.txt").read_text().splitlines()[0]
    for node in nodes:
        print(_with_values(record, {"NodeName": node, "NodeAddr": node_address(node), "NodeHostName": node}))
    return 0


def _resize(root: Path, job_id: str, hostlist: str) -> int:
    nodes = _expand(hostlist)
    with _locked_state(root) as state:
        state["nodes"] = nodes
    write_resize_script(job_id, nodes)
    return 0


def write_resize_script(job_id: str, nodes: list[str]) -> None:
    """What `scontrol update JobId= NodeList=` writes and prints in a job (also the submit tests'
    stand-in scontrol's, tests/support/submit_standins.py)."""
    from trainctl.slurm import fold_hostlist
    if "SLURM_JOBID" not in os.environ:   # _update_job_size: "No job environment here to update"
        return
    folded, count = fold_hostlist(nodes), len(nodes)
    # update_job.c, _update_job_size: a variable is rewritten only where the caller's environment has it
    sh, csh = [], []
    for name, value, quoted in (("SLURM_NODELIST", folded, True), ("SLURM_JOB_NODELIST", folded, True),
                                ("SLURM_NNODES", str(count), False), ("SLURM_JOB_NUM_NODES", str(count), False),
                                ("SLURM_JOB_CPUS_PER_NODE", f"1(x{count})", True)):
        if name in os.environ:
            sh.append(f'export {name}="{value}"' if quoted else f"export {name}={value}")
            csh.append(f'setenv {name} "{value}"' if quoted else f"setenv {name} {value}")
    if "SLURM_TASKS_PER_NODE" in os.environ:
        for name in ("SLURM_NPROCS", "SLURM_NTASKS", "SLURM_TASKS_PER_NODE"):
            sh.append(f"unset {name}")
            csh.append(f"unsetenv {name}")
    Path(f"slurm_job_{job_id}_resize.sh").write_text("".join(line + "\n" for line in sh))
    Path(f"slurm_job_{job_id}_resize.csh").write_text("".join(line + "\n" for line in csh))
    sys.stdout.write((SLURM_22 / "scontrol-update-nodelist.txt").read_text().replace("slurm_job_1_",
                                                                                     f"slurm_job_{job_id}_"))


def _update_nodes(root: Path, nodes: list[str], settings: dict[str, str]) -> int:
    with _locked_state(root) as state:
        for node in nodes:
            if settings.get("State") == "DRAIN":
                state["reasons"][node] = {"user": "root", "time": datetime.now().strftime("%Y-%m-%dT%H:%M:%S"),
                                          "reason": settings["Reason"]}
            elif settings.get("State") == "RESUME":
                state["reasons"].pop(node, None)
    return 0


def sinfo(root: Path, args: list[str]) -> int:
    from trainctl.slurm import PARTITION_FORMAT, SINFO_FORMAT
    state = _state(root)
    asked = args[args.index("-o") + 1]
    only = set(_expand(args[args.index("-n") + 1])) if "-n" in args else None
    # the dev cluster's 4 nodes; those of the job are in use (mixed), as in sinfo-states.txt
    for node in [f"node{n}" for n in range(1, 5)]:
        if only is not None and node not in only:
            continue
        if asked == PARTITION_FORMAT:
            print(f"{node}|{PARTITION}")
        elif asked == SINFO_FORMAT:
            held = state["reasons"].get(node)
            used = node in state["nodes"]
            if held:   # as sinfo-states-draining.txt: drained while in use is "draining"
                print(f"{node}|{node_address(node)}|{'draining' if used else 'drained'}|{held['user']}|"
                      f"{held['time']}|{held['reason']}")
            else:
                print(f"{node}|{node_address(node)}|{'mixed' if used else 'idle'}|Unknown|Unknown|none")
        else:
            print(f"sinfo stand-in: format not recorded: {asked}", file=sys.stderr)
            return 1
    return 0


def squeue(root: Path, args: list[str]) -> int:
    state = _state(root)
    if "--steps" not in args or "--format=%i %j" not in args:
        print(f"squeue stand-in: not recorded: {args}", file=sys.stderr)
        return 1
    for step in state["steps"]:   # as squeue-steps.txt: the numbered steps, then the batch step
        if running(step):
            print(f"{step['id']} {step['name']}")
    print(f"{state['job_id']}.batch batch")
    return 0


def scancel(root: Path, args: list[str]) -> int:
    target = [arg for arg in args if not arg.startswith("-")][0]
    for step in _state(root)["steps"]:   # scancel(1): SIGTERM, then SIGKILL after KillWait (here: SIGTERM)
        if step["id"] == target and running(step):
            os.kill(step["pid"], signal.SIGTERM)
    return 0


def sbatch(root: Path, args: list[str]) -> int:
    script = sys.stdin.read()
    with _locked_state(root) as state:
        job_id = state["next_job_id"]
        state["next_job_id"] = str(int(job_id) + 1)
        state["submitted"].append({"argv": args, "script": script, "job_id": job_id,
                                   "env": {name: os.environ.get(name) for name in sorted(os.environ)
                                           if name.startswith(("SLURM_", "TRAINCTL_"))}})
    print(job_id)   # sbatch-parsable.txt: the job id alone (no cluster name on a single cluster)
    return 0


COMMANDS_RUN = {"srun": srun, "scontrol": scontrol, "scancel": scancel, "sbatch": sbatch, "squeue": squeue,
                "sinfo": sinfo}
