"""Steps seen without code: an unmodified PyTorch program under trainctl's bootstrap reports its
optimizer steps and its main thread's activity, and runs exactly as it would without it."""

import json

from support.rank_runs import run_rank

# A plain loop, as PyTorch's docs write one: no trainctl anywhere. It prints what the bootstrap
# must leave alone.
PLAIN = """
import json, sys, warnings
first = {"torch_loaded": "torch" in sys.modules, "name": __name__, "argv": sys.argv,
         "filters": len(warnings.filters)}
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(sys.argv[1])):
    opt.zero_grad()
    model(torch.ones(8, 4)).sum().backward()
    opt.step()
print(json.dumps(first))
"""

# Its own steps win: 3 iterations with optimizer steps only, then 4 that also call progress.step().
OWN_STEPS = """
import torch
import trainctl.progress as progress
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(7):
    opt.zero_grad()
    model(torch.ones(8, 4)).sum().backward()
    opt.step()
    if i >= 3:
        progress.step()
"""

USER_SITECUSTOMIZE = "import os\nos.environ['MY_SITECUSTOMIZE_RAN'] = '1'\n"


def run(tmp_path, code, *args, bootstrap=True, extra_path=None):
    child, reports = run_rank(tmp_path, code, *args, bootstrap=bootstrap, extra_path=extra_path)
    assert child.returncode == 0, child.stderr
    return child, reports


def test_an_unmodified_program_reports_each_optimizer_step(tmp_path):
    child, reports = run(tmp_path, PLAIN, "5")
    assert max(r["steps"] for r in reports) == 5
    assert [r["steps"] for r in reports if r["window_steps"]] == [1, 2, 3, 4, 5]


def test_the_program_starts_as_it_would_without_trainctl(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(USER_SITECUSTOMIZE)
    probe = PLAIN + "import os; print(os.environ.get('MY_SITECUSTOMIZE_RAN'))\n"
    with_hook, _ = run(tmp_path, probe, "1", extra_path=str(tmp_path / "site"))
    without, reports = run(tmp_path, probe, "1", bootstrap=False, extra_path=str(tmp_path / "site"))
    assert [r["window_steps"] for r in reports] == []     # without the bootstrap: no step seen
    assert with_hook.stdout == without.stdout
    first, shadowed = with_hook.stdout.splitlines()
    assert json.loads(first)["torch_loaded"] is False and json.loads(first)["name"] == "__main__"
    assert shadowed == "1"                                  # the program's own sitecustomize still runs
    assert with_hook.stderr == without.stderr


def test_steps_the_program_reports_itself_win(tmp_path):
    _, reports = run(tmp_path, OWN_STEPS)
    # 3 optimizer steps, then the first own step's iteration counted by both, then own steps only
    assert max(r["steps"] for r in reports) == 3 + 2 + 3


# The rank's activity without steps: a program evaluating a model (busy in Python code) until
# its rank has sent a report of that (count-bound, not timed), and one blocked in one call.
BUSY = """
import time
import torch
from trainctl.guest.rank import the_rank
model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)]).eval()
torch.optim.SGD(model.parameters(), lr=0.1).step()      # the first step: the sampler starts
reporter = the_rank()
mark, give_up = None, time.monotonic() + 120
with torch.no_grad():
    while time.monotonic() < give_up:
        model(torch.ones(4, 16))
        if mark is None and reporter.activity >= 2:
            mark = reporter.last_sent
        if mark is not None and reporter.last_sent != mark:
            break                  # a report went out after the second move
"""
BLOCKED = """
import time
import torch
from trainctl.guest import activity
torch.optim.SGD(torch.nn.Linear(4, 1).parameters(), lr=0.1).step()
time.sleep(3.2 * activity.REPORT_S)
"""


def test_a_rank_busy_without_steps_reports_activity_and_a_blocked_one_does_not(tmp_path):
    _, busy = run(tmp_path, BUSY)
    _, blocked = run(tmp_path, BLOCKED)
    assert busy and max(r["activity"] for r in busy) >= 2     # seen to move, and said so
    # at most the step from the first step into the sleep; never again
    assert all(r["activity"] <= 1 for r in blocked), blocked
    assert {r["steps"] for r in busy + blocked} == {1}


# The rank's program starts other Pythons, which inherit the environment, the bootstrap included:
# a spawned worker that imports torch and runs a model but steps no optimizer (a data loader or
# compile worker), started before the rank's first step; and, after it, a forked child that steps
# (Hogwild) in the rank's memory.
PARENT = """
import os, subprocess, sys
import torch
worker = '''
import time
import torch
model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)]).eval()
end = time.monotonic() + 1.2
with torch.no_grad():
    while time.monotonic() < end:
        model(torch.ones(4, 16))
'''
subprocess.run([sys.executable, "-c", worker], check=True)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
opt.step()
child = os.fork()
if child == 0:
    for _ in range(20):
        opt.step()
    os._exit(0)
os.waitpid(child, 0)
opt.step()
print(os.getpid())
"""


def test_a_process_the_rank_starts_reports_nothing_in_its_name(tmp_path):
    parent, reports = run(tmp_path, PARENT)
    assert {r["pid"] for r in reports} == {int(parent.stdout)}, reports
    assert max(r["steps"] for r in reports) == 2
