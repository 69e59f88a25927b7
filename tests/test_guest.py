"""The guest room with programs as users write them: trainctl's code inside a rank changes nothing
the program can see. Each program runs as a watched rank (the agent's socket in its environment,
the bootstrap first on PYTHONPATH, as rank-exec starts it), and where it matters also without
trainctl, and the two are compared."""

from __future__ import annotations

import ast
import json
import signal

import pytest

from support.rank_runs import run_rank
from trainctl.guest import wire

# A program that waits for SIGUSR1 with sigwait, as signal(7) says to: the signal blocked in every
# thread, then taken synchronously. Its first steps come first, so that the sampler runs (it starts
# at the rank's first step) before the program blocks the signal in its main thread.
SIGWAIT = """
import os, signal, time
import trainctl.progress as progress
for _ in range(3):
    progress.step()
time.sleep(0.3)                        # the sampler has looked once at least
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
os.kill(os.getpid(), signal.SIGUSR1)   # process-directed, as Slurm's --signal and scancel -s send it
print(signal.sigwait({signal.SIGUSR1}))
"""

# The same with signalfd(2), through libc (the standard library has no signalfd), for SIGTERM.
SIGNALFD = """
import ctypes, os, signal, struct, time
import trainctl.progress as progress
libc = ctypes.CDLL(None, use_errno=True)
for _ in range(3):
    progress.step()
time.sleep(0.3)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
mask = ctypes.create_string_buffer(128)            # sigset_t
libc.sigemptyset(mask)
libc.sigaddset(mask, signal.SIGTERM)
fd = libc.signalfd(-1, mask, 0)
assert fd >= 0, ctypes.get_errno()
os.kill(os.getpid(), signal.SIGTERM)
print(struct.unpack_from("I", os.read(fd, 128))[0])  # ssi_signo
"""


@pytest.mark.parametrize("program, signum", [(SIGWAIT, signal.SIGUSR1), (SIGNALFD, signal.SIGTERM)],
                         ids=["sigwait", "signalfd"])
def test_a_signal_the_program_waits_for_reaches_it_and_not_the_sampler(tmp_path, program, signum):
    child, reports = run_rank(tmp_path, program)
    assert (child.returncode, child.stdout.strip()) == (0, str(int(signum))), child.stderr
    assert max(r["steps"] for r in reports) == 3      # a watched rank: the sampler ran


# A program with modules of its own beside it that share names with the standard library: from
# its first line it sees its own, and none of them was imported before it (the bootstrap imports
# nothing at start-up), whether or not it runs under trainctl.
STDLIB_NAMES = ("socket", "struct", "threading", "enum", "contextlib", "warnings")
SHADOWS = """
import sys
already = sorted(name for name in sys.argv[1:] if name in sys.modules)
mine = {name: getattr(__import__(name), "WHO", "the standard library") for name in sys.argv[1:]}
print(repr({"already": already, "mine": mine}))
"""


def test_the_programs_modules_named_as_the_standard_librarys_stay_its_own(tmp_path):
    seen = {}
    for bootstrap in (True, False):
        folder = tmp_path / ("with" if bootstrap else "without")
        folder.mkdir()
        for name in STDLIB_NAMES:
            (folder / f"{name}.py").write_text("WHO = 'the program'\n")
        child, _ = run_rank(folder, SHADOWS, *STDLIB_NAMES, bootstrap=bootstrap)
        assert child.returncode == 0, child.stderr
        seen[bootstrap] = ast.literal_eval(child.stdout)
    assert seen[True] == seen[False]
    assert seen[True]["mine"] == dict.fromkeys(STDLIB_NAMES, "the program")


# A PyTorch program with a module named trainctl beside it, that prints what it sees of its
# modules, environment and threads at its first line and after its steps.
SEES = """
import json, os, sys
start = {"modules": sorted(sys.modules), "path": sys.path[1:], "environ": dict(os.environ)}
import threading
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    model(torch.ones(8, 4)).sum().backward()
    opt.step()
import trainctl                        # the program's own, beside it (imported after torch, as isort orders them)
end = {"trainctl": getattr(trainctl, "WHO", "trainctl's"),
       "threads": threading.active_count(), "thread_names": sorted(t.name for t in threading.enumerate()),
       "top_level": sorted({name.split(".")[0] for name in sys.modules}),
       "environ_changed": sorted(k for k in set(os.environ) | set(start["environ"])
                                 if os.environ.get(k) != start["environ"].get(k)),
       "meta_path": [type(f).__name__ for f in sys.meta_path]}
print(json.dumps({"start": start, "end": end}))
"""


def test_a_torch_program_sees_its_own_trainctl_module_environment_and_threads(tmp_path):
    seen = {}
    for bootstrap in (True, False):
        folder = tmp_path / ("with" if bootstrap else "without")
        folder.mkdir()
        (folder / "trainctl.py").write_text("WHO = 'the program'\n")
        child, reports = run_rank(folder, SEES, bootstrap=bootstrap)
        assert child.returncode == 0, child.stderr
        seen[bootstrap] = json.loads(child.stdout)
        assert max((r["steps"] for r in reports), default=0) == (5 if bootstrap else 0)
    with_it, without = seen[True], seen[False]
    assert with_it["end"]["trainctl"] == "the program"
    # the bootstrap's finder waits on for the modules that save, which this program never imported
    assert with_it["end"].pop("meta_path") == ["_HookAtImport", *without["end"].pop("meta_path")]
    assert with_it["end"] == without["end"]
    # at its first line: the same modules (no sitecustomize left behind) and the same sys.path
    assert with_it["start"]["modules"] == without["start"]["modules"]
    assert with_it["start"]["path"] == without["start"]["path"]


# A rank whose handler for the job's signal changes while it trains: at its default first (the
# rank says the signal would not save), then handled (the rank takes that back).
LATE_HANDLER = """
import os, signal, sys, time
import trainctl.progress as progress
refused = os.path.join(os.environ["TRAINCTL_WATCH_DIR"], "checkpoint-signal-refused")
give_up = time.monotonic() + 120
def step_until(done):
    while not done():
        if time.monotonic() > give_up:
            sys.exit("gave up")
        progress.step()
        time.sleep(0.01)
step_until(lambda: os.path.exists(refused))
print(open(refused).read().strip())
signal.signal(signal.SIGUSR1, lambda signum, frame: None)   # the program's own save handler, installed late
step_until(lambda: not os.path.exists(refused))
print("taken back")
"""


def test_a_handler_installed_after_the_first_step_takes_the_refusal_back(tmp_path):
    watch = tmp_path / "watch"
    watch.mkdir()
    child, _ = run_rank(tmp_path, LATE_HANDLER, env={wire.WATCH_DIR_ENV: str(watch),
                                                     wire.SIGNAL_ENV: str(int(signal.SIGUSR1))})
    assert child.returncode == 0, child.stderr
    said, taken_back = child.stdout.splitlines()
    assert said.startswith("rank 0: SIGUSR1 has its default action") and taken_back == "taken back"


# torch.compile over the optimizer step: Dynamo meets the step hook inside the compiled frame.
COMPILED = """
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

@torch.compile(backend="eager")
def step():
    opt.step()

for _ in range(3):
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    step()
"""


def test_a_compiled_optimizer_step_is_counted_without_a_dynamo_warning(tmp_path):
    child, reports = run_rank(tmp_path, COMPILED)
    assert child.returncode == 0, child.stderr
    assert "Dynamo does not know" not in child.stderr, child.stderr
    assert max(r["steps"] for r in reports) == 3


# A fork while the sampler runs: the program's own at-fork hook, registered before the first step,
# runs after trainctl's (before-fork hooks run in reverse order of registration) and counts the
# process's threads at that moment; the child reports nothing in the rank's name.
FORKS = """
import os, time
import trainctl.progress as progress
threads_at_fork = []
os.register_at_fork(before=lambda: threads_at_fork.append(len(os.listdir("/proc/self/task"))))
progress.step()
time.sleep(0.3)
running = len(os.listdir("/proc/self/task"))
child = os.fork()
if child == 0:
    progress.step()
    progress.step()
    os._exit(0)
os.waitpid(child, 0)
time.sleep(0.3)
print(running, threads_at_fork[0], len(os.listdir("/proc/self/task")))
"""


def test_a_fork_sees_the_programs_threads_only_and_the_sampler_goes_on_after_it(tmp_path):
    child, reports = run_rank(tmp_path, FORKS)
    assert child.returncode == 0, child.stderr
    running, at_fork, after = map(int, child.stdout.split())
    assert (running, at_fork, after) == (2, 1, 2)     # the sampler, paused for the fork, then again
    assert {r["steps"] for r in reports} == {1}       # the child's steps are not the rank's
