"""Watching the training on the real cluster: a fault injected mid-run, by PID, namespace and
link, is detected, the node it hit is named and left out, and training restarts from its
checkpoint on the spare the job held; a program that slows by itself, and a healthy run, lose
no node.

3 training nodes + 1 held spare (the cluster has 4), examples/train_ddp.py at 0.25 s of work a
step plus an all_reduce of `--grad-mb` MiB, so that a step is bound by the wire, not by the
2 shared cores. Scenarios (`TRAINCTL_WATCH_SCENARIOS`, default the two CI runs: a,f):

  a  every link at WIRE; from step 20 the victim's at 0.3 x WIRE (tc tbf, changed mid-run): what
     its own link holds back per MB sent names it (rule link-wait), with no gate needed to find it
  c  from step 20 the victim is hung: SIGSTOP every process in its namespace
  d  from step 20 the victim's replayed kernel log (`dmesg`) has an Xid line
  e  from step 20 the program itself slows on every rank (--slow-from-step)
  f  healthy (TRAINCTL_WATCH_SECONDS long, 60 s unless set)
  n  healthy and noisy, as long: an evaluation of 5 s every 50 steps, a 3 s input stall every
     40, a save every 100 (bench only)
  g  as d, but the job has no spare (--spare 0): training restarts on the 2 nodes left

Unmodified framework programs (examples/frameworks/, no callback, no progress API: their optimizer
steps are seen by `[watch] auto_steps`, their saves by `submit --checkpoints`), 2 training nodes +
1 held spare, the fault after the program's second save seen:

  h  PyTorch's DDP tutorial program (multinode.py), the victim hung as in c
  i  the Lightning example without its TrainctlCallback line, the victim's link cut as in a (its
     --width makes about GRAD_MB of gradients a step, so that its step waits on the wire too)
  j  the Transformers Trainer example without its TrainctlCallback line, an Xid as in d
  k  as i, an Xid as in d: the job's --signal (USR1) is Lightning's requeue signal, so the watch
     must ask for a checkpoint without it (no requeue: the job's Restarts stay 0)
  l  as h, healthy
  m  as j, healthy
  o  as i, healthy
  (l, m and o train at least TRAINCTL_WATCH_SECONDS: the bench's healthy runs last minutes)

  b  every node at half a core (a cgroup v1 CFS quota, weighted against the host's other work as
     tests/test_compute_cluster.py does), 2 training nodes + 1 spare, CPU-bound steps
     (--work-matmuls); from step B_FAULT_STEP the victim's quota is cut in half: its ranks' own
     time (waiting for a CPU) names it, with no gate needed to find it

Scenario a's job is also scraped as a site would scrape it: its supervisor keeps its metrics file
in the folder a real node_exporter's textfile collector reads, and a real Prometheus scrapes that
every second (tests/support/prometheus.py); through Prometheus's query API, the job's restarts
read 1 at its end, its last checkpoint's age drops at each save, and its series end with it.

`TRAINCTL_WATCH_RUNS` runs each; every run appends a row to test-artifacts/watch-detection.tsv,
which bench/watch_detection.py summarises. `TRAINCTL_WATCH_OFF=1` runs the same faults with the
watch off and `--retries 1` (what a job had before the watch), for the goodput the watch saves. Assertions are about outcomes (who was named, whether
training went on on the spare), never about time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import prometheus
from support.sites import site_variant
from support.slurm_jobs import TRAINCTL, journal, submit, wait_for_job, wait_until
from trainctl.devcluster import faults
from support.replay import swap_replay, write_replay
from trainctl.job.goodput import goodput
from trainctl.slurm import expand_hostlist

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "examples" / "train_ddp.py")
FRAMEWORKS = REPO / "examples" / "frameworks"
LIBRARY = Path(__file__).resolve().parent / "fixtures" / "library"
ARTIFACTS = REPO / "test-artifacts"
NODES = ("node1", "node2", "node3", "node4")
WIRE = "100mbit"
SLOW_WIRE = "30mbit"                    # 0.3 x WIRE
GRAD_MB = 2                             # about 0.2 s of all_reduce a step at WIRE, 0.7 s at SLOW_WIRE
FAULT_STEP = 20
# b: CPU-bound steps, about 0.15 s of one core's matmuls (0.3 s a step at B_CORES, 0.6 s at half that)
B_CORES = 0.5
B_MATMULS = 450
B_FAULT_STEP = 50                       # past the warm-up and enough baseline samples
B_SHARES = 64 * 1024                    # cpu.shares: each node gets its quota whatever else the host runs
RUNS = int(os.environ.get("TRAINCTL_WATCH_RUNS", "1"))
SCENARIOS = tuple(os.environ.get("TRAINCTL_WATCH_SCENARIOS", "a,b,f").split(","))
HEALTHY_SECONDS = float(os.environ.get("TRAINCTL_WATCH_SECONDS", "60"))
# the same faults without the watch, for the goodput it saves: the job then has what it had
# before the watch, a requeue around lost nodes (--retries 1)
WATCH_OFF = os.environ.get("TRAINCTL_WATCH_OFF") == "1"
STEP_S = 0.25
TUTORIAL_EPOCHS = 120                   # multinode.py: 32 steps an epoch on 2 ranks, about 1 s an epoch here
LIGHTNING_STEPS = 400                   # at STEP_S: a save every 20 steps (5 s)
LIGHTNING_WIDTH = 16384                 # about GRAD_MB of gradients a step: the step waits on the wire
HF_STEPS = 1000                         # a save every 20 steps
# real kernel logs (tests/fixtures/library/SOURCES.md): one with no Xid line, one with Xid 119
CLEAN_DMESG = LIBRARY / "kernel" / "syslog" / "imbue-dmesg-mlx5-pcie-link-degraded-x8.txt"
XID_DMESG = next((LIBRARY / "kernel" / "xid").glob("gpud-xe9680-h100-dmesg-T-xid119*"))
HEALTHY_NVLINK = LIBRARY / "nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"


@dataclass(frozen=True)
class Scenario:
    name: str
    condemns: bool                      # the victim must be named and left out
    what: str
    spare: int = 1                      # allocated and held through training; none: the restart runs on the nodes left
    fault: str = ""                     # the fault of another scenario (default: its own name's)
    nodes: int = 3                      # training nodes
    program: str = "train_ddp"          # or an unmodified framework program: ddp_tutorial, lightning, hf

    def __str__(self) -> str:
        return self.name


ALL = {s.name: s for s in (
    Scenario("a", True, f"victim's link cut to {SLOW_WIRE} (others {WIRE}) from step {FAULT_STEP}"),
    Scenario("b", True, f"victim's CPU quota cut from {B_CORES:g} to {B_CORES / 2:g} of a core at step {B_FAULT_STEP}",
             nodes=2),
    Scenario("c", True, f"victim hung (SIGSTOP) at step {FAULT_STEP}"),
    Scenario("d", True, f"Xid in the victim's kernel log from step {FAULT_STEP}"),
    Scenario("e", False, f"the program slows on every rank from step {FAULT_STEP}"),
    Scenario("f", False, "healthy"),
    Scenario("n", False, "healthy, noisy: a 5 s evaluation every 50 steps, a 3 s input stall every 40, "
                         "a save every 100"),
    Scenario("g", True, "as d, with no spare: training goes on on the 2 nodes left", spare=0),
    Scenario("h", True, "DDP tutorial program, victim hung (SIGSTOP)", fault="c", nodes=2, program="ddp_tutorial"),
    Scenario("i", True, f"Lightning, no callback, victim's link cut to {SLOW_WIRE}", fault="a", nodes=2,
             program="lightning"),
    Scenario("j", True, "Transformers Trainer, no callback, Xid in the victim's kernel log", fault="d", nodes=2,
             program="hf"),
    # the job's --signal (local-demo: USR1) is Lightning's requeue signal: the watch must not send it
    Scenario("k", True, "as i, an Xid in the victim's kernel log instead", fault="d", nodes=2, program="lightning"),
    Scenario("l", False, "DDP tutorial program, healthy", fault="f", nodes=2, program="ddp_tutorial"),
    Scenario("m", False, "Transformers Trainer, no callback, healthy", fault="f", nodes=2, program="hf"),
    Scenario("o", False, "Lightning, no callback, healthy", fault="f", nodes=2, program="lightning"),
)}


def watch_site(tmp_path: Path, spare: int, slow_fault: bool = False, textfile_dir: Path | None = None) -> Path:
    return site_variant(tmp_path, "local-demo", {
        **({"metrics.textfile_dir": str(textfile_dir)} if textfile_dir else {}),
        "watch.enabled": not WATCH_OFF,
        "watch.hold_spares": spare,
        # a slowdown no node is named for is weighed against the time left (watch.pay_factor): a few
        # minutes here, never worth a restart. Where a link is cut, the nodes' own links name it
        # (rule link-wait); where they would single out nobody, the gate's fabric test must still
        # get to name it, so there every slowdown no node is named for goes to the gate (0: any
        # gain pays); elsewhere the site's own weighing holds
        **({"watch.pay_factor": 0.0} if slow_fault else {}),
        # the gate again after a detection must take seconds: one size, 6 iterations a pair
        # (about 0.1 s each at WIRE, 0.3 s at SLOW_WIRE), so it confirms within about 15 s
        "gate.fabric_sizes": ["1M"],
        "gate.fabric_iters": 3,
        "gate.fabric_passes": 2,
    })


def steps_so_far(gate_dir: Path) -> int:
    """The step of the last checkpoint the journal saw (the example writes "step N"; with and
    without the watch)."""
    notes = [e.get("note", "") for e in journal(gate_dir) if e["event"] == "checkpoint"]
    return max((int(note.split()[1]) for note in notes if note.startswith("step ")), default=0)


@contextmanager
def fault(devcluster, scenario: str, victim: str):
    """Inject the scenario's fault on `victim`; undo it on exit."""
    if scenario == "a":
        devcluster.set_rate(victim, SLOW_WIRE)
        yield
    elif scenario == "b":
        faults.set_cpu_quota(devcluster, victim, B_CORES / 2)
        yield
    elif scenario == "c":
        with faults.stopped(devcluster, victim):
            yield
    elif scenario in ("d", "g"):
        swap_replay(devcluster.node_bin_dir(victim), "dmesg", {"-T": XID_DMESG})
        yield
    else:
        yield


# each program as its docs run it, long enough (on this machine's 2 shared cores) for the fault to
# come mid-run; the glob its saves match, relative to the submit directory
FRAMEWORK_SAVES = {"ddp_tutorial": "snapshot.pt", "lightning": "ck/*.ckpt", "hf": "hf/checkpoint-*/trainer_state.json"}
WITHOUT_CALLBACK = {"lightning": ("from trainctl.integrations.lightning import TrainctlCallback\n",
                                  ",\n                   TrainctlCallback()"),
                    "hf": ("from trainctl.integrations.transformers import TrainctlCallback\n",
                           ",\n                      callbacks=[TrainctlCallback()]")}


# what a unit of each program takes on this machine's 2 cores (measured: a tutorial epoch 0.38 s, a
# Lightning step 0.5 s at STEP_S, a Trainer step 0.049 s): a healthy run trains about HEALTHY_SECONDS
TUTORIAL_EPOCH_S = 0.36
LIGHTNING_STEP_S = 0.45
HF_STEP_S = 0.045


def framework_program(scenario: Scenario, tmp_path: Path) -> list[str]:
    # a healthy run trains about HEALTHY_SECONDS or more; a faulty one until its restart has trained a while
    healthy = scenario.fault == "f"
    if scenario.program == "ddp_tutorial":
        epochs = max(TUTORIAL_EPOCHS, int(HEALTHY_SECONDS / TUTORIAL_EPOCH_S)) if healthy else TUTORIAL_EPOCHS
        return [str(FRAMEWORKS / "ddp_tutorial" / "multinode.py"), str(epochs), "5"]
    example = FRAMEWORKS / f"{scenario.program}_ddp.py" if scenario.program == "lightning" \
        else FRAMEWORKS / "hf_trainer.py"
    text = example.read_text()
    for line in WITHOUT_CALLBACK[scenario.program]:
        assert text.count(line) == 1, (example, line)
        text = text.replace(line, "")
    assert "trainctl" not in text.split('"""', 2)[2], example     # the program knows nothing of trainctl
    copy = tmp_path / example.name
    copy.write_text(text)
    if scenario.program == "lightning":
        steps = max(LIGHTNING_STEPS, int(HEALTHY_SECONDS / LIGHTNING_STEP_S)) if healthy else LIGHTNING_STEPS
        return [str(copy), "--nodes", "2", "--steps", str(steps), "--step-time", str(STEP_S),
                "--width", str(LIGHTNING_WIDTH), "--dir", "ck"]
    return [str(copy), "--steps", str(max(HF_STEPS, int(HEALTHY_SECONDS / HF_STEP_S)) if healthy else HF_STEPS),
            "--dir", "hf"]


def submit_as_a_user(devcluster, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """As tests/test_frameworks_cluster.py submits: without the tests' PYTHONSAFEPATH, which sbatch
    would pass on to the ranks (the DDP tutorial imports its datautils.py from its own folder)."""
    env = {name: value for name, value in devcluster.client_env().items() if name != "PYTHONSAFEPATH"}
    return subprocess.run([TRAINCTL, "submit", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def saves_seen(gate_dir: Path) -> int:
    return sum(e["event"] == "checkpoint" for e in journal(gate_dir))


# the scenario whose job a real Prometheus scrapes (CI runs it): a detection and a restart
SCRAPED = "a"


def scraped(server: prometheus.Prometheus, job_id: str, start: float) -> dict:
    """What Prometheus holds of the job, once its series have ended (its file removed at its end):
    the restarts and detections (summed over their kinds) and the last checkpoint's time and age,
    each as a range at the scrape interval from `start` to now ([[t, "value"], ...])."""
    job = f'job_id="{job_id}"'
    wait_until("the job's series to end in Prometheus", lambda: not server.query(f"trainctl_job_phase{{{job}}}"), 60)
    end = time.time()

    def values(expr: str) -> list:
        result = server.query_range(expr, start, end)
        assert len(result) <= 1, result
        return result[0]["values"] if result else []

    return {"restarts": values(f"sum(trainctl_job_restarts_total{{{job}}})"),
            "detections": values(f"sum(trainctl_job_detections_total{{{job}}})"),
            "checkpoint_t": values(f"trainctl_job_last_checkpoint_timestamp_seconds{{{job}}}"),
            "checkpoint_age": values(f"time() - trainctl_job_last_checkpoint_timestamp_seconds{{{job}}}")}


def run_scenario(devcluster, tmp_path: Path, scenario: Scenario) -> dict:
    # the scraped scenario's metrics go where node_exporter reads them (made before the job starts)
    textfile_dir = tmp_path / "prometheus" / "textfile" if scenario.name == SCRAPED and not WATCH_OFF else None
    if textfile_dir:
        textfile_dir.mkdir(parents=True)
    site = watch_site(tmp_path, scenario.spare, slow_fault=(scenario.fault or scenario.name) == "a",
                      textfile_dir=textfile_dir)
    submitted_t = time.time()
    checkpoint = tmp_path / "ck.pt"
    # a healthy run lasts HEALTHY_SECONDS; a fault's, until its restart has trained a while
    steps = max(int(HEALTHY_SECONDS / (STEP_S + 0.2)), 150) if scenario.name in ("f", "n") else 100
    program = [TRAIN, "--steps", str(steps), "--step-time", str(STEP_S), "--grad-mb", str(GRAD_MB),
               "--checkpoint", str(checkpoint), "--checkpoint-every", "100" if scenario.name == "n" else "10",
               "--timeout", "120"]
    if scenario.name == "n":
        program += ["--eval-every", "50", "--stall-every", "40"]
    if scenario.name == "e":
        program += ["--slow-from-step", str(FAULT_STEP), "--slow-step-time", "0.8"]
    if scenario.name == "b":
        program = [TRAIN, "--steps", str(B_FAULT_STEP + 60), "--work-matmuls", str(B_MATMULS),
                   "--checkpoint", str(checkpoint), "--checkpoint-every", "10", "--timeout", "120"]
    with ExitStack() as undo:
        if scenario.name == "b":
            for node in NODES:
                undo.enter_context(faults.cpu_quota(devcluster, node, B_CORES, shares=B_SHARES))
        for node in NODES:
            devcluster.set_rate(node, WIRE)
            undo.callback(devcluster.set_rate, node, None)
            for made in (write_replay(devcluster.node_bin_dir(node), "dmesg", {"-T": CLEAN_DMESG}),
                         # the local-demo gate's nvlink.links reads a replayed `nvidia-smi nvlink -s`
                         write_replay(devcluster.node_bin_dir(node), "nvidia-smi", {"nvlink -s": HEALTHY_NVLINK})):
                undo.callback(made.unlink, missing_ok=True)
        retries = ["--retries", "1"] if WATCH_OFF else []
        if scenario.program == "train_ddp":
            result = submit(devcluster, tmp_path, "--site", str(site), "--nodes", str(scenario.nodes),
                            "--spare", str(scenario.spare), "--min-nodes", "2", *retries, "--", *program)
        else:   # as a user would: the nodes, a spare, where the program saves; the defaults otherwise
            result = submit_as_a_user(devcluster, tmp_path, "--site", str(site), "--nodes", str(scenario.nodes),
                                      "--spare", str(scenario.spare), "--checkpoints",
                                      FRAMEWORK_SAVES[scenario.program], *retries, "--",
                                      *framework_program(scenario, tmp_path))
        assert result.returncode == 0, result.stderr
        job_id = result.stdout.strip().splitlines()[-1]
        gate_dir = tmp_path / f"trainctl-gate-{job_id}"
        # the daemons start while the job queues and gates
        server = undo.enter_context(prometheus.scraped_textfiles(textfile_dir.parent)) if textfile_dir else None
        if scenario.program == "train_ddp":
            fault_step = B_FAULT_STEP if scenario.name == "b" else FAULT_STEP
            wait_until("training reached the fault's step", lambda: steps_so_far(gate_dir) >= fault_step, 240)
        else:   # its steps seen (auto_steps) and its second save
            wait_until("the program's steps and its second save", lambda: saves_seen(gate_dir) >= 2 and any(
                e["event"] == "first_step" for e in journal(gate_dir)), 300)
        if textfile_dir:   # the job's metrics file as node_exporter reads it, by Prometheus's own linter; kept
            text = (textfile_dir / f"trainctl-job-{job_id}.prom").read_text()
            assert prometheus.lint(text) == ""
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / f"metrics-job{job_id}-{int(time.time())}.prom").write_text(text)
        events = journal(gate_dir)
        batch_host = next(e["batch_host"] for e in events if e["event"] == "job_start")
        training = next(e for e in events if e["event"] == "training_start")
        victim = next(n for n in expand_hostlist(training["nodes"]) if n != batch_host)
        fault_t = time.time()
        with fault(devcluster, scenario.fault or scenario.name, victim):
            if scenario.condemns:   # the fault lasts until the watch has judged it, or the job ended
                wait_until("a decision or the job's end", lambda: any(
                    e["event"] in ("confirmation", "job_end") for e in journal(gate_dir)), 600 if WATCH_OFF else 240)
            record = wait_for_job(devcluster, job_id, timeout_s=600)
        if (scenario.fault or scenario.name) == "c":
            faults.restore_node(devcluster, victim, timeout_s=120)
        chain = [journal(gate_dir)]
        successor = (json.loads((gate_dir / "retry.json").read_text()).get("successor")
                     if (gate_dir / "retry.json").exists() else None)
        if successor:   # without the watch: the requeued job, to its end, its nodes' replays still in place
            record = wait_for_job(devcluster, successor, timeout_s=600)
            chain.append(journal(tmp_path / f"trainctl-gate-{successor}"))
        metrics = scraped(server, job_id, submitted_t) if server else None
    outcome = summarise(chain[0], victim, fault_t)
    wall = goodput(chain, time.time())
    outcome.update(job_id=job_id, state=record["JobState"], victim=victim, gate_dir=str(gate_dir),
                   jobs=len(chain), wall_s=wall.wall_s, goodput=wall.ratio, requeues=record.get("Restarts"),
                   signals_sent=[e.get("signal") for e in chain[0] if e["event"] == "checkpoint_request"],
                   metrics=metrics, saves=[(e["t"], e.get("checkpoint_t", e["t"])) for e in chain[0] if e["event"] == "checkpoint"],
                   restarts=sum(1 for e in chain[0] if e["event"] == "training_start" and e.get("restart")))
    return outcome


def summarise(events: list[dict], victim: str, fault_t: float) -> dict:
    detections = [e for e in events if e["event"] == "detection"]
    confirmations = [e for e in events if e["event"] == "confirmation"]
    restart_t = min((e["t"] for e in events if e["event"] == "training_start" and e.get("restart")), default=None)
    # training again: the first step reported after the restart
    restarts = [e for e in events if e["event"] == "first_step" and restart_t and e["t"] >= restart_t]
    named = sorted({node for c in confirmations for node in c.get("named", {})})
    first = detections[0] if detections else None
    # the decision: a detection that names the node itself (sick, hung), else the gate's confirmation
    decided = next((e for e in events if (e["event"] == "detection" and e.get("suspects"))
                    or (e["event"] == "confirmation" and e.get("named"))), None)
    restart_after = next((r for r in restarts if decided and r["t"] >= decided["t"]), None)
    def confirmed(detection: dict) -> list[str]:
        """A slowdown names nobody itself: the nodes the gate's confirmation after it named."""
        if detection["suspects"] or detection["kind"] != "slow":
            return detection["suspects"]
        after = next((c for c in confirmations if c["t"] >= detection["t"]), None)
        return sorted(after.get("named", {})) if after else []

    first_step = next((e["t"] for e in events if e["event"] == "first_step"), None)
    end = next((e["t"] for e in events if e["event"] == "job_end"), None)
    return {
        "trained_s": end - first_step if first_step and end else None,   # first step to the job's end
        # the training steps the watch ended; the slowdowns it weighed and let go
        "stops": sum(1 for d in detections if not d.get("note")),
        "first_suspects": detections[0]["suspects"] if detections else [],   # named by the detection itself
        "let_go": sum(1 for e in events if e["event"] == "weighed" and e.get("action") in ("go on", "passed")),
        "detections": [(d["kind"], confirmed(d)) for d in detections],
        "evidence": [d["evidence"] for d in detections],
        "named": named,
        "right": named == [victim],
        "fault_to_detection_s": first["t"] - fault_t if first else None,
        "fault_to_decision_s": decided["t"] - fault_t if decided else None,
        "decision_to_training_s": restart_after["t"] - decided["t"] if restart_after else None,
        "restart_nodes": next((e["nodes"] for e in events if e["event"] == "training_start" and e.get("restart")),
                              None),
    }


def record_row(scenario: Scenario, run_number: int, outcome: dict) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    # the journal beside its row: pytest's temporary folders are rotated away by later sessions
    kept = ARTIFACTS / "watch-journals"
    kept.mkdir(exist_ok=True)
    shutil.copyfile(Path(outcome["gate_dir"]) / "journal.jsonl",
                    kept / f"{scenario.name}-{run_number}-job{outcome['job_id']}-{int(time.time())}.jsonl")

    def seconds(value):
        return "" if value is None else f"{value:.1f}"

    with open(ARTIFACTS / "watch-detection.tsv", "a") as out:
        out.write("\t".join([scenario.name, str(run_number), outcome["job_id"], outcome["state"], outcome["victim"],
                             ",".join(outcome["named"]) or "-", str(outcome["right"]),
                             seconds(outcome["fault_to_detection_s"]), seconds(outcome["fault_to_decision_s"]),
                             seconds(outcome["decision_to_training_s"]),
                             ";".join(f"{k}:{','.join(s) or '-'}" for k, s in outcome["detections"]) or "-",
                             "off" if WATCH_OFF else "watch", str(outcome["jobs"]), seconds(outcome["wall_s"]),
                             "" if outcome["goodput"] is None else f"{outcome['goodput']:.3f}",
                             str(outcome["stops"]), str(outcome["let_go"]), seconds(outcome["trained_s"])]) + "\n")


@pytest.mark.parametrize("run_number", range(RUNS))
@pytest.mark.parametrize("scenario", [ALL[name] for name in SCENARIOS], ids=str)
def test_the_watch_names_the_faulty_node_and_training_goes_on_without_it(devcluster, tmp_path, scenario, run_number):
    outcome = run_scenario(devcluster, tmp_path, scenario)
    record_row(scenario, run_number, outcome)
    if WATCH_OFF:   # a measurement of what the job does without the watch: only that it did not watch
        assert outcome["detections"] == [], outcome
        return
    assert outcome["state"] == "COMPLETED", outcome
    if scenario.condemns:
        assert outcome["named"] == [outcome["victim"]], outcome
        restarted_on = expand_hostlist(outcome["restart_nodes"])
        assert outcome["victim"] not in restarted_on, outcome
        assert len(restarted_on) == (scenario.nodes if scenario.spare else scenario.nodes - 1), outcome
    else:
        assert outcome["named"] == [], outcome
    if scenario.program == "lightning":   # USR1 is Lightning's requeue signal: never sent by the watch
        assert set(outcome["signals_sent"]) <= {None}, outcome
        assert bool(outcome["signals_sent"]) == scenario.condemns, outcome   # asked for a save only when it acts
        assert outcome["requeues"] == "0", outcome
    # The example times its sleep as compute, outside the all_reduce: a slow wire leaves it
    # unchanged. A slower program raises it on every node, but the detection may come first from
    # a busy machine's slower all_reduce: then it is unchanged too. Never on some nodes only.
    slow_evidence = [line for line in outcome["evidence"] if line.startswith("step time")][:1]
    if scenario.name == "a":
        assert slow_evidence and "compute time per step is unchanged on every node" in slow_evidence[0], outcome
        # the victim's own link names it (it held back per MB sent as before, the others' less), or,
        # where the links' margin is too thin to say, nobody, and the gate's fabric test does
        # (above): never a healthy node. bench/watch_detection.py counts which, over many runs
        kind, suspects = outcome["detections"][0]
        assert kind == "slow" and suspects in ([outcome["victim"]], []), outcome
        if outcome["first_suspects"]:
            assert "rule link-wait" in slow_evidence[0] and f"{outcome['victim']} eth0: held back" in slow_evidence[0], outcome
    if scenario.name == "b":   # the ranks' own time named the node: no gate was needed to find it
        assert outcome["detections"][0] == ("slow", [outcome["victim"]]), outcome
        assert "rule own-time" in slow_evidence[0] and "waiting for one" in slow_evidence[0], outcome
    if scenario.name == "e":
        assert not any("compute time per step rose on node" in line for line in slow_evidence), outcome
    if scenario.name in ("f", "n"):
        assert outcome["detections"] == [], outcome
    if outcome["metrics"] is not None:
        assert_scraped(outcome)


def assert_scraped(outcome: dict) -> None:
    """What Prometheus scraped of the job agrees with its journal: one restart at its end, after one
    detection; the last checkpoint's time is always one the journal saw, every save that stayed the
    newest for a few scrapes shows, and the age drops where each save shows."""
    scraped = outcome["metrics"]
    restarts = [float(value) for _, value in scraped["restarts"]]
    assert outcome["restarts"] == 1 and restarts and restarts[0] == 0 and restarts[-1] == 1, scraped["restarts"]
    assert float(scraped["detections"][-1][1]) == len(outcome["detections"]), scraped["detections"]
    saves = outcome["saves"]    # (when the supervisor saw it, when it was written), in order
    stamps = [(t, float(value)) for t, value in scraped["checkpoint_t"]]
    seen = {stamp for _, stamp in stamps}
    assert seen and all(any(abs(stamp - written) < 1e-3 for _, written in saves) for stamp in seen), (stamps, saves)
    ages = {t: float(value) for t, value in scraped["checkpoint_age"]}
    shown_at = {}    # each save the series shows after its first: the step before it and the step it shows at
    for (before, old), (t, new) in zip(stamps, stamps[1:]):
        if new != old:
            shown_at.setdefault(new, (before, t))
    # a save made more than a scrape after the one before it drops the age where it shows (one made
    # sooner, as the save the watch asks for right after a detection can be, raises it by less)
    spaced = [written for (_, earlier), (_, written) in zip(saves, saves[1:]) if written - earlier > prometheus.SCRAPE_S]
    dropped = [ages[t] < ages[before] for stamp, (before, t) in shown_at.items()
               if any(abs(stamp - written) < 1e-3 for written in spaced)]
    assert dropped and all(dropped), (stamps, ages, saves)
    # every save that stayed the newest for 3 scrapes or more while the series ran shows
    first, last = stamps[0][0], stamps[-1][0]
    held = [written for (at, written), (next_at, _) in zip(saves, saves[1:])
            if first <= at and next_at <= last and next_at - at >= 3 * prometheus.SCRAPE_S]
    assert held and all(any(abs(stamp - written) < 1e-3 for stamp in seen) for written in held), (held, sorted(seen))
