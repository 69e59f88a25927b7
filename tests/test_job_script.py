"""`trainctl submit job.sbatch`: a team's own Slurm job script, read (`trainctl.launcher.job_script`),
merged with the site's options, rendered and refused in one line where trainctl cannot place it.

The three public job scripts are kept verbatim in tests/fixtures/job-scripts/, and as edited to run
on CPU in the dev cluster in tests/fixtures/job-scripts/dev-cluster/ (tests/fixtures/library/SOURCES.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from test_render import check_shell
from test_submit import REPO, TRAINCTL, sbatch_ran, submit
from trainctl.errors import UsageError
from trainctl.launcher.job_script import (looks_like_job_script, merge_directives, parse_job_script,
                                          program_at_run_time, training_program)

FIXTURES = REPO / "tests" / "fixtures" / "job-scripts"
LOCAL_DEMO = str(REPO / "site-configs" / "local-demo.toml")
PYTORCH = "pytorch-examples-sbatch_run.sh"
ACCELERATE = "accelerate-submit_multinode.sh"
TORCHTITAN = "torchtitan-multinode_trainer.slurm"


def parsed(name: str, folder: Path = FIXTURES):
    return parse_job_script((folder / name).read_text(), name)


def refusal(text: str) -> str:
    with pytest.raises(UsageError) as caught:
        parse_job_script(text, "job.sbatch")
    return str(caught.value)


# ---------------------------------------------------------------- the public scripts, verbatim

def test_the_pytorch_ddp_tutorial_script_parses_into_its_parts():
    script = parsed(PYTORCH)
    assert [d.argv for d in script.directives] == [
        "--job-name=multinode-example", "--nodes=4", "--ntasks=4", "--gpus-per-task=1", "--cpus-per-task=4"]
    assert (script.training.first, script.training.last) == (18, 24)   # continuation lines joined
    assert script.training.words[:2] == ("srun", "torchrun") and script.training.words[-1] == "10"
    assert "--rdzv_id" in script.training.shown and "2024" in script.training.shown   # ${job_id} followed
    kinds = {c.first: c.kind for c in script.commands}
    assert kinds[12] == "helper" and kinds[15] == "environment"
    program, translation = training_program(script.training.shown)
    assert program == ("/shared/examples/multinode_torchrun.py", "50", "10")
    assert translation.launcher == "torchrun"


def test_the_accelerate_script_runs_its_launcher_from_a_variable():
    script = parsed(ACCELERATE)
    assert script.training.words == ("srun", "$CMD") and not script.training.known
    shown = script.training.shown
    assert shown[:3] == ("srun", "accelerate", "launch")
    assert "$((SLURM_NNODES * GPUS_PER_NODE))" in shown           # one word until the job expands it
    assert [d.argv for d in script.directives][1] == "--chdir=."      # -D . in sbatch's long form
    # upstream's CMD names $PYTHON_FILE and $ARGS, which it never sets: only the job can tell
    with pytest.raises(UsageError, match="accelerate launch"):
        training_program(shown)


def test_the_torchtitan_script_keeps_its_lines_after_the_training_line():
    script = parsed(TORCHTITAN)
    assert script.training.first == 63 and [c.text for c in script.after] == ["dcgmi profile --resume"]
    assert script.training.words[-1] == '"$@"'
    program, _ = training_program(script.training.shown)
    assert program[:2] == ("-m", "torchtitan.train")
    assert "torchtitan_recipes.tests.models.llama3" in program     # ${MODULE:-"..."} followed


@pytest.mark.parametrize("name", [PYTORCH, ACCELERATE, TORCHTITAN])
def test_each_public_script_is_told_from_a_program(name):
    assert looks_like_job_script(name, (FIXTURES / name).read_bytes())
    assert not looks_like_job_script("run.sh", b"#!/bin/bash\nexec python train.py\n")
    assert not looks_like_job_script("train.py", b"import torch\n")


# ---------------------------------------------------------------- the #SBATCH lines

def test_sbatch_reads_directives_only_before_the_first_command():
    script = parse_job_script("#!/bin/bash\n#SBATCH -N 2\n# a comment\n\n#SBATCH --time 10\nexport A=1\n"
                              "#SBATCH --nodes=9\nsrun python train.py\n", "job.sbatch")
    assert [d.argv for d in script.directives] == ["--nodes=2", "--time=10"]


def test_options_trainctl_owns_are_taken_over_with_one_line_each_and_the_others_kept():
    script = parse_job_script("#!/bin/bash\n#SBATCH --nodes=2-4 --ntasks-per-node=8 --gres=gpu:8\n"
                              "#SBATCH --output=out.%j --mem=100G --partition=big --signal=USR1@60\n"
                              "srun python train.py\n", "job.sbatch")
    merged = merge_directives(script.directives, {"partition": "small"}, "job.sbatch")
    assert (merged.nodes, merged.min_nodes, merged.gpus_per_node) == (4, 2, 8)
    assert merged.partition is None and merged.signal == "USR1@60" and merged.sbatch == ("--mem=100G",)
    taken = [note for note in merged.notes if "taken over" in note]
    assert len(taken) == 5 and all(note.count("\n") == 0 for note in merged.notes)
    assert any("--partition=big" in note and "wins" in note for note in merged.notes)


@pytest.mark.parametrize("directive, reason", [("--array=1-4", "job array"), ("--dependency=afterok:1", "successor")])
def test_an_option_trainctl_cannot_honour_is_refused_naming_its_line(directive, reason):
    script = parse_job_script(f"#!/bin/bash\n#SBATCH {directive}\nsrun python t.py\n", "job.sbatch")
    with pytest.raises(UsageError, match=f"job.sbatch:2: .*{reason}"):
        merge_directives(script.directives, {}, "job.sbatch")


# ---------------------------------------------------------------- what cannot be placed: one line

def test_two_training_lines_are_refused():
    message = refusal("#!/bin/bash\nsrun python train.py\nsrun python eval.py\n")
    assert message.startswith("job.sbatch:3: a second training line (lines 2, 3)")


def test_a_loop_around_srun_is_refused():
    message = refusal("#!/bin/bash\nfor seed in 1 2; do\n  srun python train.py --seed $seed\ndone\n")
    assert message.startswith("job.sbatch:3: the training line is inside a loop (for, line 2)")


def test_a_training_line_in_a_function_is_refused():
    message = refusal("#!/bin/bash\nrun() {\n  srun torchrun train.py\n}\nrun\n")
    assert message.startswith("job.sbatch:3: the training line is inside function run (line 2)")


def test_a_training_line_in_an_if_is_refused():
    assert "inside `if` (line 2)" in refusal("#!/bin/bash\nif true; then srun python t.py; fi\n")


def test_no_training_line_is_refused_and_a_bare_python_is_named():
    message = refusal("#!/bin/bash\n#SBATCH -N 2\nmodule load cuda\npython train.py --lr 1\n")
    assert message.startswith("job.sbatch: no training line")
    assert "line 4 runs python once, on the batch host" in message and "\n" not in message


def test_a_training_line_in_a_pipe_is_refused():
    assert "a pipe, a redirection" in refusal("#!/bin/bash\nsrun python t.py | tee log\n")


def test_another_shell_is_refused():
    assert refusal("#!/bin/zsh\nsrun python t.py\n").startswith("job.sbatch:1: #!/bin/zsh")


def test_helper_sruns_and_here_documents_are_not_training_lines():
    script = parse_job_script("#!/bin/bash -l\nsrun --ntasks-per-node=1 mkdir -p /tmp/x\ncat > cfg <<EOF\n"
                              "srun python fake.py\nEOF\nsrun python train.py\n", "job.sbatch")
    assert script.training.first == 6 and script.shebang == "#!/bin/bash -l"
    assert [c.kind for c in script.commands] == ["helper", "command"]


# ---------------------------------------------------------------- in the job: the words bash expanded

def test_the_job_translates_the_expanded_words_whatever_the_counts_say():
    program, line = program_at_run_time(
        ("srun", "accelerate", "launch", "--num_processes", "3", "--num_machines", "3", "--main_process_ip",
         "10.0.0.1", "loop.py", "--lr", "1"), "python3")
    assert program == ("python3", "loop.py", "--lr", "1") and "accelerate launch" in line
    assert program_at_run_time(("srun", "-N", "2", "python", "t.py"), "python3")[0] == ("python", "t.py")
    with pytest.raises(UsageError, match="without a training script"):
        program_at_run_time(("srun", "accelerate", "launch", "--num_machines", "2"), "python3")


# ---------------------------------------------------------------- submit: dry run and rendered script

def dev_cluster_copy(tmp_path: Path, name: str) -> Path:
    shutil.copy(FIXTURES / "dev-cluster" / name, tmp_path / name)
    for program in ("multinode_torchrun.py", "accelerate_loop.py"):
        (tmp_path / program).write_text("")
    return tmp_path / name


@pytest.mark.parametrize("name, training, runs", [
    (PYTORCH, "training line 18: srun torchrun --nnodes 2", "each runs python3 multinode_torchrun.py 20 5"),
    (ACCELERATE, "training line 40: srun accelerate launch", "each runs python3 accelerate_loop.py --mixed_precision no"),
    (TORCHTITAN, "training line 62: srun torchrun --nnodes 2", "each runs python3 -m torchtitan.train"),
])
def test_the_dry_run_says_what_it_understood_and_renders_a_clean_script(tmp_path, name, training, runs):
    dev_cluster_copy(tmp_path, name)
    result = submit(tmp_path, "--site", LOCAL_DEMO, "--dry-run", name, "one", "two words")
    assert result.returncode == 0, result.stderr
    assert not sbatch_ran(tmp_path)
    said = result.stderr
    assert training in said and runs in said and "taken over" in said
    assert "helper srun" in said or name == ACCELERATE
    script = result.stdout
    check_shell(script, tmp_path)
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --cpus-per-task=1\n" in script
    assert "set -- one 'two words'\n" in script
    assert '-- "${training_line[@]}" <<' in script
    assert script.splitlines()[0] == "#!/bin/bash"


def test_the_rendered_script_runs_the_prelude_and_expands_the_training_line_in_bash(tmp_path):
    """The script's own lines run once, before trainctl's, and the training line's words reach
    `job run` as bash expands them: a stand-in trainctl prints what it was given."""
    job = tmp_path / "job.sbatch"
    job.write_text('#!/bin/bash\n#SBATCH --nodes=1\nexport MY_SETTING=from-prelude\nhead=node7\n'
                   'srun torchrun --nnodes 1 --rdzv_endpoint $head:29500 train.py --tag "$1" --n $SLURM_NNODES\n'
                   'echo after: $MY_SETTING\n')
    (tmp_path / "train.py").write_text("")
    stand_in = tmp_path / "fake-trainctl"
    stand_in.write_text('#!/bin/bash\necho "env: $MY_SETTING"; printf "word: %s\\n" "$@"; cat >/dev/null\n')
    stand_in.chmod(0o755)
    site = tmp_path / "site.toml"
    site.write_text((REPO / "site-configs" / "local-demo.toml").read_text().replace(
        'trainctl = ""                       #', f'trainctl = "{stand_in}" #', 1))
    result = submit(tmp_path, "--site", str(site), "--dry-run", "job.sbatch", "a b")
    assert result.returncode == 0, result.stderr
    (tmp_path / "rendered.sh").write_text(result.stdout)
    ran = subprocess.run(["bash", str(tmp_path / "rendered.sh")], capture_output=True, text=True, timeout=30,
                         cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "SLURM_SUBMIT_DIR": str(tmp_path),
                                            "SLURM_JOB_ID": "7", "SLURM_NNODES": "3"})
    assert ran.returncode == 0, ran.stderr
    words = [line[len("word: "):] for line in ran.stdout.splitlines() if line.startswith("word: ")]
    assert "env: from-prelude" in ran.stdout and "after: from-prelude" in ran.stdout
    assert words[words.index("--") + 1:] == ["srun", "torchrun", "--nnodes", "1", "--rdzv_endpoint", "node7:29500",
                                             "train.py", "--tag", "a b", "--n", "3"]


def test_a_job_script_submit_says_the_taken_over_options_and_submits(tmp_path):
    dev_cluster_copy(tmp_path, PYTORCH)
    result = submit(tmp_path, "--site", LOCAL_DEMO, "--nodes", "1", PYTORCH)
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --nodes=2 (line 4): submit --nodes 1 wins" in result.stderr
    assert "torchrun translated" in result.stderr
    assert "--parsable" in json.loads((tmp_path / "bin" / "sbatch.argv.json").read_text())


def test_a_refused_job_script_submits_nothing(tmp_path):
    (tmp_path / "job.sbatch").write_text("#!/bin/bash\nsrun python a.py\nsrun python b.py\n")
    result = submit(tmp_path, "--site", LOCAL_DEMO, "job.sbatch")
    assert result.returncode == 2 and not sbatch_ran(tmp_path)
    assert result.stderr.strip().count("\n") == 0 and "job.sbatch:3: a second training line" in result.stderr


def test_job_run_takes_the_training_line_after_its_options():
    result = subprocess.run([TRAINCTL, "job", "run", "--help"], capture_output=True, text=True, timeout=60)
    assert "[-- TRAINING LINE...]" in result.stdout
