"""The watch's checkpoint requests and the framework callbacks, on this machine: the rank's side of
the channel (`trainctl.progress.checkpoint_requested`), the supervisor's (`checkpoint_request`'s
executors, with a real process as the step: the request posted, the signal sent, the save
awaited), the node agent passing a request on, the ranks agreeing on a step, and a real Lightning and Hugging Face Trainer program (one CPU process each) saving through
their own save path when asked, with Lightning's own requeue handler for Slurm's signal still in place;
and a rank judging whether the job's signal would get a save (without the callback, Lightning's
SIGUSR1 would requeue the job: the rank says so, and the supervisor does not send it)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainctl import progress
from trainctl.guest import requests as guest_requests
from trainctl.guest import signal_judge, wire
from trainctl.integrations.shared import SaveRequests
from trainctl.job.checkpoint_request import await_save, post_checkpoint_request, send_signal
from trainctl.job.jobdir import CHECKPOINT_REQUEST as REQUEST_FILE
from trainctl.job.jobdir import Checkpoints, JobPaths
from trainctl.job.machine import CheckpointAsked
from trainctl.job.jobdir import CHECKPOINT_ENV
from trainctl.guest.wire import WATCH_DIR_ENV

REPO = Path(__file__).resolve().parents[1]
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
PROGRAMS = REPO / "examples" / "frameworks"


# ---------------------------------------------------------------- the rank's side

def reader(tmp_path: Path, watch: Path | None = None) -> guest_requests.RequestReader:
    return guest_requests.RequestReader(wire.request_path(str(tmp_path / "agent.sock")), str(watch) if watch else None)


def test_a_request_is_seen_once_and_a_new_token_again(tmp_path, monkeypatch):
    monkeypatch.setattr(guest_requests, "POLL_S", 0.0)
    ranks = reader(tmp_path)
    path = Path(wire.request_path(str(tmp_path / "agent.sock")))
    assert not ranks.requested()                       # no request yet
    path.write_text("a1\n")
    assert ranks.requested() and not ranks.requested()
    os.utime(path, ns=(1, 1))                          # touched, same token: no new request
    assert not ranks.requested()
    path.write_text("b2\n")
    assert ranks.requested()


def test_a_rank_looks_at_the_file_at_most_every_poll_interval(tmp_path, monkeypatch):
    monkeypatch.setattr(guest_requests, "POLL_S", 3600.0)
    ranks = reader(tmp_path)
    assert not ranks.requested()
    Path(wire.request_path(str(tmp_path / "agent.sock"))).write_text("a1\n")
    assert not ranks.requested()                       # looked a moment ago: not again before the interval


def test_asking_marks_the_watch_folder_once_as_a_listener(tmp_path):
    watch = tmp_path / "watch"
    watch.mkdir()
    reader(tmp_path, watch).requested()
    assert (watch / wire.LISTENING_FILE).is_file()
    reader(tmp_path, tmp_path / "no-such-folder").requested()   # a folder it cannot write: no error


@pytest.mark.parametrize("what", ["directory", "fifo", "symlink", "another-users"])
def test_a_request_file_that_is_not_a_regular_file_is_no_request_and_never_blocks(tmp_path, monkeypatch, what):
    monkeypatch.setattr(guest_requests, "POLL_S", 0.0)
    path = Path(wire.request_path(str(tmp_path / "agent.sock")))
    if what == "directory":
        path.mkdir()
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "symlink":
        (tmp_path / "target").write_text("a1\n")
        path.symlink_to(tmp_path / "target")
    else:                                      # made by another user: a forged request
        path.write_text("a1\n")
        os.chown(path, 65534, 65534)
    assert not reader(tmp_path).requested()


def test_outside_a_watched_job_nothing_is_requested():
    code = "import trainctl.progress as p; from trainctl.guest import rank; print(p.checkpoint_requested(), rank.requests())"
    env = {k: v for k, v in os.environ.items() if k != wire.SOCKET_ENV}
    out = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "None"]


def test_the_progress_module_names_the_watch_folder_variable_of_the_agent_socket_module():
    code = "import trainctl.progress as p; from trainctl.guest import rank; print(rank.requests().watch_dir)"
    env = dict(os.environ, **{wire.SOCKET_ENV: "/nonexistent/s.sock", WATCH_DIR_ENV: "/nonexistent/watch"})
    out = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "/nonexistent/watch"


# ---------------------------------------------------------------- the ranks agree on a step

def test_ranks_agree_every_n_steps_and_save_once_per_request(monkeypatch):
    asked = iter([False, True] + [False] * 100)
    monkeypatch.setattr(progress, "checkpoint_requested", lambda: next(asked))
    requests = SaveRequests(every_n_steps=5)
    reduced = []

    def any_rank(flag):
        reduced.append(flag)
        return flag

    decisions = [requests.due(step, any_rank) for step in range(1, 16)]
    assert [step for step, due in zip(range(1, 16), decisions) if due] == [5]
    assert reduced == [True, False, False]             # the all-reduce runs at steps 5, 10, 15 only
    assert requests.due(15, any_rank) is False and len(reduced) == 3   # one all-reduce a step, however often asked


def test_the_docs_quote_the_callbacks_default_interval():
    from trainctl.integrations.shared import EVERY_N_STEPS

    page = (REPO / "docs" / "your-program.md").read_text()
    assert f"every {EVERY_N_STEPS} optimizer steps (`TrainctlCallback(every_n_steps={EVERY_N_STEPS})`)" in page


def test_a_failing_all_reduce_is_no_save_and_no_error(monkeypatch):
    monkeypatch.setattr(progress, "checkpoint_requested", lambda: True)

    def broken(flag):
        raise RuntimeError("process group gone")

    assert SaveRequests(every_n_steps=1).due(1, broken) is False


# ---------------------------------------------------------------- the supervisor's side

# A training step as the supervisor sees it: a real process that saves snapshot.pt when it gets
# SIGUSR1 (the job's signal), and says on stdout when its handler is in place.
SAVES_ON_SIGNAL = """
import signal, sys, time
def save(signum, frame):
    with open("snapshot.pt", "w") as out:
        out.write("state")
    sys.exit(0)
signal.signal(signal.SIGUSR1, save)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def step(tmp_path):
    """The running step, its handler in place; ended at the test's end."""
    process = subprocess.Popen([sys.executable, "-c", SAVES_ON_SIGNAL], cwd=tmp_path, stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline() == "ready\n"
    yield process
    process.kill()
    process.wait()


def ended_step(tmp_path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", "pass"], cwd=tmp_path)
    process.wait()
    return process


def test_a_request_is_posted_for_the_agents_with_what_the_ranks_said_of_themselves(tmp_path, step):
    (tmp_path / "watch").mkdir()
    assert post_checkpoint_request(str(tmp_path), step) == CheckpointAsked(True, False, "", True)
    first = (tmp_path / "watch" / REQUEST_FILE).read_text().strip()
    (tmp_path / "watch" / wire.LISTENING_FILE).touch()
    (tmp_path / "watch" / wire.SIGNAL_REFUSED_FILE).write_text("rank 1: SIGUSR1 is ignored\x1b[2J\nmore\n")
    asked = post_checkpoint_request(str(tmp_path), step)
    assert asked.posted and asked.listening and asked.running
    assert asked.refused.startswith("rank 1: SIGUSR1 is ignored") and "\x1b" not in asked.refused
    assert (tmp_path / "watch" / REQUEST_FILE).read_text().strip() not in ("", first)   # a new token


def test_no_request_is_posted_for_an_ended_step_or_through_a_symlinked_folder(tmp_path, step):
    (tmp_path / "watch").mkdir()
    assert post_checkpoint_request(str(tmp_path), ended_step(tmp_path)) == CheckpointAsked(False, False, "", False)
    assert not (tmp_path / "watch" / REQUEST_FILE).exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "watch").rmdir()
    (tmp_path / "watch").symlink_to(elsewhere)
    (elsewhere / wire.LISTENING_FILE).touch()
    assert post_checkpoint_request(str(tmp_path), step) == CheckpointAsked(False, False, "", True)
    assert list(elsewhere.iterdir()) == [elsewhere / wire.LISTENING_FILE]      # nothing written through it


def test_the_signal_reaches_the_step_and_the_save_it_makes_is_the_one_awaited(tmp_path, step):
    paths = JobPaths(tmp_path / "trainctl-gate-1")
    paths.root.mkdir()
    seen = Checkpoints(paths, ("snapshot.pt",), tmp_path, since=0.0, slice_s=math.inf)   # a whole pass a look
    send_signal(step, signal.SIGUSR1)
    save = await_save(step, seen.poll, wait_s=600)
    if save is None:                                   # the step saved and ended before a look saw it
        save = seen.poll()
    assert save is not None and save.source == "snapshot.pt" and step.wait(timeout=60) == 0
    send_signal(step, signal.SIGUSR1)                  # it has ended: nothing is sent, no error


def test_the_wait_for_a_save_ends_with_the_step(tmp_path):
    paths = JobPaths(tmp_path / "trainctl-gate-1")
    paths.root.mkdir()
    assert await_save(ended_step(tmp_path), Checkpoints(paths, (), tmp_path, since=0.0).poll, wait_s=3600) is None


# ---------------------------------------------------------------- would the job's signal get a save?

def own_handler(signum, frame):
    pass


def test_a_handler_that_would_not_save_is_named_and_the_programs_own_is_not():
    from lightning.pytorch.trainer.connectors.signal_connector import _HandlersCompose

    usr1 = signal.SIGUSR1
    assert "default action" in signal_judge.signal_refusal(usr1, signal.SIG_DFL)
    assert "ignored" in signal_judge.signal_refusal(usr1, signal.SIG_IGN)
    assert "KeyboardInterrupt" in signal_judge.signal_refusal(signal.SIGINT, signal.default_int_handler)
    assert "Lightning" in signal_judge.signal_refusal(usr1, _HandlersCompose([own_handler]))
    assert signal_judge.signal_refusal(usr1, own_handler) is None
    assert signal_judge.signal_refusal(usr1, None) is None          # set outside Python: cannot tell

    class OddModule:                                            # a callable whose __module__ is no name
        __module__ = 7

        def __call__(self, signum, frame):
            pass

    assert signal_judge.signal_refusal(usr1, OddModule()) is None


def test_a_rank_says_why_the_signal_would_not_save_and_takes_it_back_when_it_handles_it(tmp_path, monkeypatch):
    judge = signal_judge.SignalJudge(signal.SIGUSR1, str(tmp_path), 3)
    refused = tmp_path / wire.SIGNAL_REFUSED_FILE
    monkeypatch.setattr(signal_judge._signal, "getsignal", lambda signum: own_handler)
    judge.look(1.0)
    assert not refused.exists()
    monkeypatch.setattr(signal_judge._signal, "getsignal", lambda signum: signal.SIG_DFL)
    judge.look(1.5)                                             # within a second of the last look: not judged
    assert not refused.exists()
    judge.look(2.0)
    said = refused.read_text()
    assert said.startswith("rank 3: SIGUSR1 has its default action")
    other = signal_judge.SignalJudge(signal.SIGUSR1, str(tmp_path), 5)
    other.look(2.0)                                             # another rank: the first one's words stay
    assert refused.read_text() == said
    monkeypatch.setattr(signal_judge._signal, "getsignal", lambda signum: own_handler)
    other.look(3.0)                                             # rank 5 handles it now: rank 3's words stay
    assert refused.read_text() == said
    judge.look(3.0)                                             # rank 3 handles it now: taken back
    assert not refused.exists()


@pytest.mark.parametrize("signal_env, judged", [("10", 10), ("", None), ("USR1", None), ("-3", None), ("0", None)])
def test_a_rank_judges_the_jobs_signal_only_when_given_a_signal_number(tmp_path, signal_env, judged):
    # a rank that steps with SIGUSR1 at its default says so: tests/test_guest.py, a late handler
    judge = signal_judge.judge_from_env({WATCH_DIR_ENV: str(tmp_path), wire.SIGNAL_ENV: signal_env}, 0)
    assert (judge.signum if judge else None) == judged
    assert signal_judge.judge_from_env({wire.SIGNAL_ENV: "10"}, 0) is None    # no watch folder: nobody to tell


# ---------------------------------------------------------------- the node agent passes it on

RANK = """
import sys, time
import trainctl.progress as progress
from trainctl.guest import requests
requests.POLL_S = 0.05
deadline = time.monotonic() + 120
seen = 0
while time.monotonic() < deadline and seen < 2:
    progress.step()
    if progress.checkpoint_requested():
        seen += 1
        print("requested", flush=True)
    time.sleep(0.02)
"""


def test_a_request_reaches_a_listening_rank_through_the_node_agent_once_per_request(tmp_path):
    from trainctl.agent_socket import agent_socket_path

    gate = tmp_path / "gate"
    (gate / "watch").mkdir(parents=True)
    (gate / "watch" / REQUEST_FILE).write_text("from-an-earlier-step\n")   # not passed on: no request of this step
    env = dict(os.environ, SLURM_JOB_ID="4343", SLURMD_NODENAME="node2", TMPDIR=str(tmp_path))
    socket_path = agent_socket_path("4343", "node2", env)
    agent = subprocess.Popen([TRAINCTL, "job", "agent", "--dir", str(gate), "--site", "local-demo"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank = None
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(socket_path):
            assert time.monotonic() < deadline and agent.poll() is None, "the agent did not bind its socket"
            time.sleep(0.1)
        rank = subprocess.Popen([sys.executable, "-P", "-c", RANK], stdout=subprocess.PIPE, text=True,
                                env=dict(env, RANK="0", **{wire.SOCKET_ENV: socket_path,
                                                           WATCH_DIR_ENV: str(gate / "watch")}))
        while not (gate / "watch" / wire.LISTENING_FILE).exists():
            assert time.monotonic() < deadline, "the rank did not say it listens"
            time.sleep(0.1)
        for token in ("first", "second"):
            (gate / "watch" / REQUEST_FILE).write_text(token + "\n")
            assert rank.stdout.readline() == "requested\n"
        assert rank.wait(timeout=60) == 0
    finally:
        if rank is not None and rank.poll() is None:
            rank.kill()
        agent.terminate()
        agent.communicate(timeout=30)
    assert not os.path.exists(wire.request_path(socket_path))   # the agent takes its copy away


# ---------------------------------------------------------------- real framework programs, one process

def single_process_env(tmp_path: Path, with_request: bool) -> dict[str, str]:
    """A rank's environment in a watched step, with the agent's request file already there."""
    socket_path = str(tmp_path / "agent.sock")
    (tmp_path / "watch").mkdir(exist_ok=True)
    if with_request:
        Path(wire.request_path(socket_path)).write_text("token\n")
    env = dict(os.environ, RANK="0", **{wire.SOCKET_ENV: socket_path, WATCH_DIR_ENV: str(tmp_path / "watch"),
                                         CHECKPOINT_ENV: str(tmp_path / "checkpoint.seen")})
    for name in [name for name in env if name.startswith("SLURM_")]:
        del env[name]
    return env


def test_a_lightning_program_saves_through_lightning_when_the_watch_asks(tmp_path):
    env = single_process_env(tmp_path, with_request=True)
    out = subprocess.run([sys.executable, "-P", str(PROGRAMS / "lightning_ddp.py"), "--steps", "25",
                          "--dir", str(tmp_path / "ck")], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    import torch

    asked = torch.load(tmp_path / "ck" / "last-trainctl.ckpt", weights_only=False)
    assert asked["global_step"] == 10                  # the first step the ranks agree on after the ask
    assert sorted(path.name for path in (tmp_path / "ck").iterdir()) == [
        "epoch=0-step=20.ckpt", "last-trainctl.ckpt", "last.ckpt"]
    assert (tmp_path / "checkpoint.seen").read_text() == "step 20\n"   # then ModelCheckpoint's own save, seen too
    assert (tmp_path / "watch" / wire.LISTENING_FILE).exists()


LIGHTNING_UNDER_SLURM = """
import signal, sys
# SIGUSR1 at its default, as a srun task's starts: Lightning installs its requeue handler only where
# none is set (signal_connector.py, _has_already_handler), and an ignored SIGUSR1 survives exec, so
# this process would inherit one from a test runner that ignores it (trainctl's own steps do)
signal.signal(signal.SIGUSR1, signal.SIG_DFL)
import lightning as L
sys.path.insert(0, sys.argv[1])
from lightning_ddp import Regression
from trainctl.integrations.lightning import TrainctlCallback
import torch
from torch.utils.data import DataLoader, TensorDataset

class Show(L.Callback):
    def on_train_start(self, trainer, pl_module):
        handlers = getattr(signal.getsignal(signal.SIGUSR1), "signal_handlers", [])
        print("seen:", type(trainer._accelerator_connector.cluster_environment).__name__,
              *[handler.__name__ for handler in handlers], flush=True)

trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, callbacks=[TrainctlCallback(), Show()],
                    enable_progress_bar=False, logger=False, enable_checkpointing=False,
                    enable_model_summary=False)
trainer.fit(Regression(0.0), DataLoader(TensorDataset(torch.randn(64, 32), torch.randn(64, 1)), batch_size=8))
"""


def test_with_the_callback_lightning_still_handles_slurms_signal_itself(tmp_path):
    """Slurm's time-limit signal keeps working as Lightning users expect: the callback takes over no
    signal, so under srun Lightning's SLURMEnvironment installs its requeue handler for SIGUSR1."""
    env = single_process_env(tmp_path, with_request=False)
    env.update(SLURM_NTASKS="1", SLURM_JOB_NAME="train", SLURM_JOB_ID="77", SLURM_PROCID="0", SLURM_LOCALID="0",
               SLURM_NODEID="0", SLURM_NODELIST="localhost")
    out = subprocess.run([sys.executable, "-P", "-c", LIGHTNING_UNDER_SLURM, str(PROGRAMS)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    seen = [line for line in out.stdout.splitlines() if line.startswith("seen:")]
    assert seen == ["seen: SLURMEnvironment _slurm_sigusr_handler_fn"], out.stdout


LIGHTNING_WITHOUT_CALLBACK = """
import os, signal, sys, time
signal.signal(signal.SIGUSR1, signal.SIG_DFL)      # as a srun task's starts (see LIGHTNING_UNDER_SLURM)
import lightning as L
sys.path.insert(0, sys.argv[1])
from lightning_ddp import Regression
import torch
from torch.utils.data import DataLoader, TensorDataset

class WaitForTheRanksWord(L.Callback):             # the test's probe, not trainctl: it only waits
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        said = os.path.join(os.environ["TRAINCTL_WATCH_DIR"], sys.argv[2])
        deadline = time.monotonic() + 120
        while batch_idx >= 2 and not os.path.exists(said) and time.monotonic() < deadline:
            time.sleep(0.05)

trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=4, callbacks=[WaitForTheRanksWord()],
                    enable_progress_bar=False, logger=False, enable_checkpointing=False,
                    enable_model_summary=False)
trainer.fit(Regression(0.0), DataLoader(TensorDataset(torch.randn(64, 32), torch.randn(64, 1)), batch_size=8))
"""


def test_a_lightning_rank_without_the_callback_says_the_jobs_signal_is_lightnings(tmp_path):
    """Unmodified Lightning under srun with the job's --signal USR1: the rank (trainctl loaded by
    rank-exec's bootstrap, its optimizer steps counted) says that SIGUSR1 is Lightning's requeue
    handler, so the watch never sends it."""
    from trainctl.launcher.rank_exec import BOOTSTRAP_DIR

    env = single_process_env(tmp_path, with_request=False)
    env.update(SLURM_NTASKS="1", SLURM_JOB_NAME="train", SLURM_JOB_ID="77", SLURM_PROCID="0", SLURM_LOCALID="0",
               SLURM_NODEID="0", SLURM_NODELIST="localhost", PYTHONPATH=BOOTSTRAP_DIR,
               **{wire.SIGNAL_ENV: str(int(signal.SIGUSR1))})
    out = subprocess.run([sys.executable, "-P", "-c", LIGHTNING_WITHOUT_CALLBACK, str(PROGRAMS),
                          wire.SIGNAL_REFUSED_FILE], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    said = (tmp_path / "watch" / wire.SIGNAL_REFUSED_FILE).read_text()
    assert said.startswith("rank 0: SIGUSR1 is Lightning's"), said


def test_a_transformers_trainer_saves_when_the_watch_asks(tmp_path):
    env = single_process_env(tmp_path, with_request=True)
    out = subprocess.run([sys.executable, "-P", str(PROGRAMS / "hf_trainer.py"), "--steps", "12",
                          "--dir", str(tmp_path / "out")], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    saved = sorted(path.name for path in (tmp_path / "out").glob("checkpoint-*"))
    assert saved == ["checkpoint-10", "checkpoint-12"], saved   # 10: asked; 12: the Trainer's own, at the end
    assert json.loads((tmp_path / "out" / "checkpoint-10" / "trainer_state.json").read_text())["global_step"] == 10
    assert (tmp_path / "checkpoint.seen").read_text() == "step 12\n"
