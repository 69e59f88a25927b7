"""Slurm's expedited requeue (`sbatch --requeue=expedite`, 25.11+) against trainctl's successor job,
measured on a dev cluster that offers it (Slurm 26.05, `SlurmctldParameters=enable_expedited_requeue`).

Run (root; needs the 26.05 root, built by scripts/setup --slurm 26.05; `--cases NAME...` runs only those):
    TRAINCTL_DEVCLUSTER_INSTANCE=K .venv/bin/python bench/expedited_requeue.py [--rounds 1]

Each case starts a 2-node batch job A, queues a 3-node job C behind it (C cannot start while A
runs), then kills A's second node for real (`faults.kill_node`: slurmd, slurmstepds and tasks)
and waits until Slurm marks it down. After the failure three nodes are usable: A's restart (2
nodes) and C (3) cannot both run, so the one that starts first shows the priority each path
gets. The cases, interleaved round by round:

- expedite, --no-kill: what trainctl's jobs are (the gate keeps running on the nodes left).
- expedite:            the same job without --no-kill.
- plain requeue:       --requeue without expedite, without --no-kill.
- successor:           --no-kill; at the failure a new job excluding the lost node is submitted
                       with --dependency=afterany:A (what trainctl's retry submits), and A's
                       script then ends with status 1 (what the supervisor does).
- expedite, exit 1:    a 1-node job whose script exits 1 on healthy nodes (a program's failure).

Printed per case: whether A (or its successor) ran again, seconds from "node down" to running
again, whether that was before C, the job id, Restarts and the final state.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from trainctl.devcluster import faults
from trainctl.devcluster.cluster import DevCluster
from trainctl.devcluster.spec import spec_for_instance
from trainctl.proc import run, run_checked
from trainctl.slurm import parse_scontrol_config, parse_scontrol_oneliner

EXPEDITE_CONF = "SlurmctldParameters=enable_expedited_requeue"
POLL_S = 0.2
WAIT_S = 120.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cases", nargs="*", metavar="CASE", help="only these (default: all)")
    args = parser.parse_args()
    spec = dataclasses.replace(spec_for_instance(), slurm="26.05", extra_slurm_conf=(EXPEDITE_CONF,))
    cluster = DevCluster(spec)
    cluster.up()
    try:
        bench = Bench(cluster)
        config = parse_scontrol_config(bench.client(["scontrol", "show", "config"]))
        print(f"{bench.client(['scontrol', '--version']).strip()}; "
              f"SlurmctldParameters = {config.get('SlurmctldParameters')}; "
              f"PriorityType = {config.get('PriorityType')}; SlurmdTimeout = {config.get('SlurmdTimeout')}")
        cases = [bench.expedite_no_kill, bench.expedite, bench.plain_requeue, bench.successor,
                 bench.expedite_exit_1]
        cases = [case for case in cases if not args.cases or case.__name__ in args.cases]
        for round_number in range(args.rounds):
            for case in cases:
                print(f"round {round_number + 1}: {case.__name__}: {case()}", flush=True)
    finally:
        cluster.down()
    return 0


class Bench:
    def __init__(self, cluster: DevCluster):
        self.cluster = cluster
        self.dir = Path(cluster.spec.base_dir) / "bench-expedite"
        self.dir.mkdir(exist_ok=True)
        (self.dir / "long.sh").write_text("#!/bin/sh\nsrun sleep 600\nexit 1\n")
        (self.dir / "exit1.sh").write_text("#!/bin/sh\nsleep 1\nexit 1\n")
        (self.dir / "short.sh").write_text("#!/bin/sh\nsleep 20\n")

    def client(self, argv: list[str]) -> str:
        return run_checked(argv, timeout=30, env=self.cluster.client_env()).stdout

    def sbatch(self, *options: str, script: str = "long.sh") -> str:
        return self.client(["sbatch", "--parsable", f"--chdir={self.dir}", f"--output={self.dir}/%j.out",
                            *options, str(self.dir / script)]).strip()

    def job(self, job_id: str) -> dict[str, str]:
        result = run(["scontrol", "show", "job", "-o", job_id], timeout=30, env=self.cluster.client_env())
        records = parse_scontrol_oneliner(result.stdout) if result.ok else []
        return records[0] if records else {}

    def wait(self, what: str, check, timeout_s: float = WAIT_S):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(POLL_S)
        raise TimeoutError(f"{what} after {timeout_s:g} s")

    def running(self, job_id: str) -> dict[str, str] | None:
        record = self.job(job_id)
        return record if record.get("JobState") == "RUNNING" else None

    def node_down(self, node: str) -> bool:
        state = self.client(["sinfo", "-h", "-n", node, "-o", "%T"]).strip()
        return state.startswith(("down", "fail"))

    def lose_second_node(self, options: tuple[str, ...]) -> tuple[str, str, str, float]:
        """Job A on 2 nodes, C (3 nodes) queued behind it; A's second node killed. Returns A, C,
        the lost node and the monotonic time Slurm marked it down."""
        job_a = self.sbatch("-N2", *options)
        nodes = self.wait("A running", lambda: self.running(job_a))["NodeList"]
        lost = self.client(["scontrol", "show", "hostnames", nodes]).split()[1]
        job_c = self.sbatch("-N3", script="short.sh")
        self.wait("C pending", lambda: self.job(job_c).get("JobState") == "PENDING")
        faults.kill_node(self.cluster, lost)
        self.wait(f"{lost} down", lambda: self.node_down(lost))
        return job_a, job_c, lost, time.monotonic()

    def first_to_run(self, job_a: str, job_c: str, down_at: float) -> str:
        def started():
            for job_id, name in ((job_a, "A"), (job_c, "C")):
                if self.running(job_id):
                    return name
            return None
        try:
            first = self.wait("A or C running", started, timeout_s=60)
        except TimeoutError:
            return "neither ran within 60 s"
        return f"{first} first, {time.monotonic() - down_at:.1f} s after the node went down"

    def clean(self, lost: str | None, *jobs: str) -> None:
        run(["scancel", *jobs], timeout=30, env=self.cluster.client_env())
        active = ("RUNNING", "PENDING", "COMPLETING")
        self.wait("jobs gone", lambda: all(self.job(j).get("JobState") not in active for j in jobs))
        if lost:
            faults.restore_node(self.cluster, lost)
        self.cluster.wait_idle()

    def describe(self, job_id: str) -> str:
        record = self.job(job_id)
        return (f"job {job_id}: JobState={record.get('JobState')} Restarts={record.get('Restarts')} "
                f"Reason={record.get('Reason')} NodeList={record.get('NodeList')}")

    def expedite_no_kill(self) -> str:
        job_a, job_c, lost, down_at = self.lose_second_node(("--no-kill", "--requeue=expedite"))
        time.sleep(10)
        result = f"10 s after {lost} went down: {self.describe(job_a)}"
        self.clean(lost, job_a, job_c)
        return result

    def _requeued(self, *options: str) -> str:
        job_a, job_c, lost, down_at = self.lose_second_node(options)
        first = self.first_to_run(job_a, job_c, down_at)
        result = f"{first}; {self.describe(job_a)}"
        self.clean(lost, job_a, job_c)
        return result

    def expedite(self) -> str:
        return self._requeued("--requeue=expedite")

    def plain_requeue(self) -> str:
        return self._requeued("--requeue")

    def successor(self) -> str:
        job_a, job_c, lost, down_at = self.lose_second_node(("--no-kill",))
        job_s = self.sbatch("-N2", f"--exclude={lost}", f"--dependency=afterany:{job_a}")
        self.wait("A's step ended by the node loss", lambda: self.job(job_a).get("JobState") != "RUNNING")
        first = self.first_to_run(job_s, job_c, down_at).replace("A first", "successor first")
        result = f"{first}; {self.describe(job_s)}; A: {self.describe(job_a)}"
        self.clean(lost, job_a, job_s, job_c)
        return result

    def expedite_exit_1(self) -> str:
        job = self.sbatch("-N1", "--requeue=expedite", script="exit1.sh")
        def settled() -> bool:
            record = self.job(job)
            return record.get("JobState") in ("FAILED", "REQUEUE_HOLD") or (
                record.get("JobState") == "PENDING" and record.get("Restarts", "0") != "0")
        self.wait("requeued or ended", settled)
        time.sleep(5)
        record = self.job(job)
        result = f"{self.describe(job)} Priority={record.get('Priority')}"
        self.clean(None, job)
        return result


if __name__ == "__main__":
    sys.exit(main())
