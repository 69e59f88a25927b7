"""Stand-ins for the job-script tests of `trainctl submit`.

The job's own logic (quoting, the supervisor's gate steps, the release, the hand-over to
rank-exec) is what these tests check, so the commands around it are replaced by small scripts that
record what they were given: `sbatch` (argv and the script on stdin), `srun` (one local
task) and the gate half of `trainctl` (answers from environment variables; the real gate
has tests of its own). `rank-exec` is always the real one.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

REAL_TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
JOB_ID = "4242"

# Words that would run something, or arrive changed, if any step quoted them wrongly.
# `{mark}` is replaced by a path whose existence proves that something ran.
NASTY_WORDS = ("it's", 'say "hi"', "$(touch {mark})", "`touch {mark}`", "two  words", "line1\nline2",
               "tab\there", "back\\slash", "x; touch {mark} && echo", "*", "~", "$HOME", "#no comment",
               "'", "", "--flag=a b", "\\n", "ünïcode ✓")


def nasty(mark: Path) -> list[str]:
    return [word.replace("{mark}", str(mark)) for word in NASTY_WORDS]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def write_sbatch(bin_dir: Path) -> Path:
    """`sbatch` that saves its argv (sbatch.argv.json) and stdin (sbatch.stdin) beside itself."""
    return _write(bin_dir / "sbatch", f"""#!{sys.executable}
import json, sys
from pathlib import Path
here = Path(__file__).parent
(here / "sbatch.argv.json").write_text(json.dumps(sys.argv[1:]))
(here / "sbatch.stdin").write_text(sys.stdin.read())
print("{JOB_ID}")
""")


def write_srun(bin_dir: Path) -> Path:
    """`srun` that runs its command as the one task of a one-node step, here; logs its argv."""
    return _write(bin_dir / "srun", f"""#!/bin/bash
# steps run in the background (the gate, the sentinel) log concurrently: one entry at a time
{{ flock 9; printf '%s\\0' "$@" >&9; printf '\\n' >&9; }} 9>> {shlex.quote(str(bin_dir / 'srun.log'))}
while [[ $# -gt 0 && "$1" == -* ]]; do shift; done
export SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_NTASKS=1 SLURM_TASKS_PER_NODE=1
exec "$@"
""")


def write_scontrol(bin_dir: Path, *, refuse_update: str = "") -> Path:
    """`scontrol show hostnames LIST`, and `update JobId=ID NodeList=LIST`, logged to
    scontrol-update.log beside itself. An update writes and prints what Slurm 22.05.8's scontrol
    did on the dev cluster (`slurm_standins.write_resize_script`); or, with `refuse_update`,
    prints that on stderr and exits 1."""
    return _write(bin_dir / "scontrol", f"""#!{sys.executable}
import sys
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from slurm_standins import write_resize_script
from trainctl.slurm import expand_hostlist
args = sys.argv[1:]
if args[:2] == ["show", "hostnames"]:
    print("\\n".join(expand_hostlist(args[2])))
    sys.exit(0)
assert args[0] == "update" and args[1].startswith("JobId=") and args[2].startswith("NodeList="), args
with open(Path(__file__).with_name("scontrol-update.log"), "a") as log:
    log.write(" ".join(args) + "\\n")
if {refuse_update!r}:
    print({refuse_update!r}, file=sys.stderr)
    sys.exit(1)
write_resize_script(args[1].split("=", 1)[1], expand_hostlist(args[2].split("=", 1)[1]))
""")


def write_squeue(bin_dir: Path) -> Path:
    """`squeue` that lists no steps (the script looks up its sentinel and gate steps by name):
    the test does not depend on whether a real squeue, with no cluster to ask, is installed."""
    return _write(bin_dir / "squeue", "#!/bin/sh\nexit 0\n")


def write_trainctl(path: Path, *, log: Path, decision: str = "", failure: str = "") -> Path:
    """`trainctl` whose `gate node`/`gate decide` answer as told; `job run` and `rank-exec` are the real ones.

    Every gate call appends a line to `log` (the node's name and the arguments). `gate decide`
    answers `decision` (nodes, newline, master address) as the real one does: decision.json in
    its --dir (the chosen nodes, the job's others left out, `master_addr`; what the supervisor
    reads) and the two lines on stdout; or, if `failure` is set, prints that on stderr and
    exits 2. The answers are written into the script, so a job started over SSH (whose
    environment comes from sshd, not from the test) gets them too.
    """
    writer = _write(path.with_name("write-decision.py"), f"""#!{sys.executable}
import os, sys
from pathlib import Path
from trainctl.job import jobdir
from trainctl.job.decision import Decision, Exclusion, Reason
from trainctl.slurm import expand_hostlist
gate_dir, nodes, master_addr = sys.argv[1:]
chosen = tuple(expand_hostlist(nodes))
allocated = tuple(expand_hostlist(os.environ["SLURM_JOB_NODELIST"]))
left_out = tuple(Exclusion(host, (Reason("stand-in gate", "not chosen"),)) for host in allocated if host not in chosen)
decision = Decision(allocated, chosen, chosen, left_out, (), len(chosen), len(chosen), master_addr=master_addr)
jobdir.write_json(jobdir.JobPaths(Path(gate_dir)).decision, decision.to_json())
""")
    return _write(path, f"""#!/bin/bash
set -euo pipefail
log={shlex.quote(str(log))}
case "${{1:-}} ${{2:-}}" in
  "gate node")
    echo "${{SLURMD_NODENAME:-$(hostname)}} $*" >> "$log";;
  "gate sentinel")
    echo "sentinel $*" >> "$log";;
  "gate decide")
    echo "decide $*" >> "$log"
    failure={shlex.quote(failure)}
    if [[ -n "$failure" ]]; then
        echo "$failure" >&2
        exit 2
    fi
    dir=""; previous=""
    for word in "$@"; do [[ "$previous" == --dir ]] && dir="$word"; previous="$word"; done
    {shlex.quote(str(writer))} "$dir" {" ".join(shlex.quote(part) for part in decision.partition(chr(10))[::2])}
    printf '%s\\n' {shlex.quote(decision)};;
  "rank-exec "*|"job run")
    exec {shlex.quote(REAL_TRAINCTL)} "$@";;
  *)
    echo "stand-in trainctl: unexpected arguments: $*" >&2
    exit 64;;
esac
""")


def write_dump_program(path: Path, dump_dir: Path) -> Path:
    """A .py program that writes its argv and its rank's environment to `dump_dir`/rank<RANK>.json."""
    dump_dir.mkdir(parents=True, exist_ok=True)
    return _write(path, f"""import json, os, sys
names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
         "MASTER_PORT", "SLURM_JOB_NAME", "SLURMD_NODENAME", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
         "NCCL_IB_DISABLE", "NCCL_IB_HCA"]
out = os.path.join({str(dump_dir)!r}, f"rank{{os.environ['RANK']}}.json")
with open(out, "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": {{n: os.environ.get(n) for n in names}}}}, f)
""")


def standin_site(directory: Path, trainctl: Path) -> Path:
    """A copy of the local-demo site whose jobs run `trainctl` (a stand-in) on the nodes."""
    sample = Path(__file__).resolve().parents[2] / "site-configs" / "local-demo.toml"
    lines = sample.read_text().splitlines()
    at = lines.index("[launch]") + 1
    assert lines[at].startswith("trainctl = ")
    lines[at] = f"trainctl = {json.dumps(str(trainctl))}  # the gate stand-in (tests/support)"
    path = directory / "local-demo-standin.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def read_dumps(dump_dir: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in dump_dir.glob("rank*.json")}
