"""A launcher on `trainctl submit`'s command line, turned into what trainctl runs itself.

trainctl is the job's launcher: it starts one rank per GPU with its own srun step and gives each
the torch.distributed variables. A launcher given as the program (`torchrun train.py`) would run
under every one of those ranks and start its own workers with its own RANK and WORLD_SIZE, whose
rendezvous never completes. So `translate(argv)` recognises, with no I/O:

- `torchrun ...` and `python -m torch.distributed.run ...` (torch/distributed/run.py,
  `get_args_parser`), `python -m torch.distributed.launch ...` (torch/distributed/launch.py:
  the same options and `--use-env`), as torch 2.13 defines them;
- `accelerate launch ...`, `accelerate-launch ...`, `python -m accelerate.commands.launch ...`
  (accelerate/commands/launch.py, `launch_command_parser`, accelerate 1.16);
- `deepspeed ...`, `python -m deepspeed.launcher.runner ...` (deepspeed/launcher/runner.py,
  `parse_args`);
- any of them after `srun [OPTIONS]`,

and returns the training program with its own arguments (`SCRIPT ARGS`, `-m MODULE ARGS`, or
`PYTHON SCRIPT ARGS` where a Python was named), the counts the launcher was given (for the plan
to carry or refuse), the options trainctl replaces with why, or a `Refusal`: one line naming the
option trainctl cannot honour and what to do instead. Options are read as each launcher's
argparse reads them: `--opt value` and `--opt=value`, a short option's value attached (`-r3`),
and, where the parser allows it (torchrun, deepspeed), a long option shortened to a unique prefix.
"""

from __future__ import annotations

import re
from typing import NamedTuple

PYTHON_MODULE = "-m"      # a program `-m MODULE ARGS` runs under Python, which finds the module

# Why trainctl drops an option, by what trainctl does in its place.
RENDEZVOUS = "rendezvous: trainctl's ranks meet at the MASTER_ADDR and MASTER_PORT it sets"
RESTARTS = "restarts: trainctl restarts the job around a bad node (--retries)"
AGENT = "the launcher's own worker agent, which trainctl's srun step replaces"
OUTPUT = "output: each rank's output is kept by trainctl (the site's launch.rank_output, trainctl job show)"
BINDING = "binding: trainctl binds each rank to its GPU's CPUs and NUMA node"
HOSTS = "hosts: trainctl starts the ranks on the nodes Slurm allocated and the gate passed, with its own srun"
LAYOUT = "layout: trainctl's ranks are the processes, one per GPU"
LOCAL_RANK_ENV = "trainctl sets LOCAL_RANK in each rank's environment"
MESSAGES = "the launcher's own messages"
SRUN = "trainctl starts every rank with its own srun step"
PLACEMENT = ("placement: trainctl runs one rank per GPU on the nodes the gate chooses (the job's #SBATCH --nodes, "
             "or submit --nodes)")


class Dropped(NamedTuple):
    """An option of the launcher that trainctl replaces: as it was written, and why."""

    option: str
    reason: str


class Translation(NamedTuple):
    """What trainctl runs in the launcher's place, and what the launcher was told."""

    launcher: str                        # as the user would name it: "torchrun", "accelerate launch" ...
    program: tuple[str, ...]             # each rank's program: SCRIPT ARGS, -m MODULE ARGS, PYTHON SCRIPT ARGS
    nodes: int | None = None             # the launcher's node count (torchrun --nnodes N, or MAX of MIN:MAX)
    min_nodes: int | None = None         # torchrun --nnodes MIN:MAX: the fewest nodes it would run on
    ranks_per_node: int | None = None    # torchrun --nproc-per-node N, deepspeed --num_gpus N
    total_ranks: int | None = None       # accelerate --num_processes N: the ranks of all machines together
    mapped: tuple[tuple[str, str], ...] = ()   # (count, the option that gave it as written): ("nodes", "--nnodes 2")
    dropped: tuple[Dropped, ...] = ()


class Refusal(NamedTuple):
    """A launcher's option that trainctl cannot honour: one line, the option and what to do instead."""

    launcher: str
    reason: str


class Option(NamedTuple):
    names: tuple[str, ...]
    takes_value: bool
    action: str                          # what the translation does with it (see _apply)
    why: str = ""                        # the reason it is dropped, or the refusal's text


def _options(*options: Option) -> dict[str, Option]:
    return {name: option for option in options for name in option.names}


def _flag(*names: str, action: str = "drop", why: str = "") -> Option:
    return Option(names, False, action, why)


def _valued(*names: str, action: str = "drop", why: str = "") -> Option:
    return Option(names, True, action, why)


# torch/distributed/run.py, get_args_parser (torch 2.13).
TORCHRUN = _options(
    _valued("--nnodes", action="nnodes"),
    _valued("--nproc-per-node", "--nproc_per_node", action="nproc"),
    *(_valued(*names, why=RENDEZVOUS) for names in (
        ("--rdzv-backend", "--rdzv_backend"), ("--rdzv-endpoint", "--rdzv_endpoint"), ("--rdzv-id", "--rdzv_id"),
        ("--rdzv-conf", "--rdzv_conf"), ("--node-rank", "--node_rank"), ("--master-addr", "--master_addr"),
        ("--master-port", "--master_port"), ("--local-addr", "--local_addr"))),
    _flag("--standalone", why=RENDEZVOUS),
    _valued("--max-restarts", "--max_restarts", why=RESTARTS),
    *(_valued(*names, why=AGENT) for names in (
        ("--monitor-interval", "--monitor_interval"), ("--start-method", "--start_method"),
        ("--event-log-handler", "--event_log_handler"), ("--role",),
        ("--signals-to-handle", "--signals_to_handle"), ("--shutdown-timeout", "--shutdown_timeout"))),
    *(_valued(*names, why=OUTPUT) for names in (
        ("--log-dir", "--log_dir"), ("-r", "--redirects"), ("-t", "--tee"),
        ("--local-ranks-filter", "--local_ranks_filter"), ("--duplicate-stdout-filters", "--duplicate_stdout_filters"),
        ("--duplicate-stderr-filters", "--duplicate_stderr_filters"), ("--logs-specs", "--logs_specs"))),
    _valued("--numa-binding", "--numa_binding", why=BINDING),
    _flag("-m", "--module", action="module"),
    _flag("--no-python", "--no_python", action="no_python"),
    _flag("--run-path", "--run_path", why="the script runs under Python as a file, as runpy.run_path runs it"),
    _flag("--virtual-local-rank", "--virtual_local_rank", action="refuse",
          why="each trainctl rank sees its node's GPUs with LOCAL_RANK as its index; drop it and pick the "
              "device by LOCAL_RANK"),
)
# torch/distributed/launch.py, parse_args: torchrun's options and --use-env.
TORCH_LAUNCH = {**TORCHRUN, **_options(_flag("--use-env", "--use_env", action="use_env", why=LOCAL_RANK_ENV))}

# accelerate/commands/launch.py, launch_command_parser (accelerate 1.16). Any other option of it
# configures Accelerator() through environment variables that only `accelerate launch` sets.
ACCELERATE = _options(
    _valued("--num_machines", "--num-machines", action="nodes"),
    _valued("--num_processes", "--num-processes", action="total_ranks"),
    *(_valued(*names, why=RENDEZVOUS) for names in (
        ("--machine_rank", "--machine-rank"), ("--main_process_ip", "--main-process-ip"),
        ("--main_process_port", "--main-process-port"), ("--rdzv_backend", "--rdzv-backend"),
        ("--rdzv_conf", "--rdzv-conf"))),
    _flag("--same_network", "--same-network", why=RENDEZVOUS),
    _valued("--max_restarts", "--max-restarts", why=RESTARTS),
    _valued("--monitor_interval", "--monitor-interval", why=AGENT),
    _valued("--role", why=AGENT),
    _valued("-t", "--tee", why=OUTPUT),
    _valued("--log_dir", "--log-dir", why=OUTPUT),
    _flag("--multi_gpu", "--multi-gpu", why=LAYOUT),
    _flag("--enable_cpu_affinity", "--enable-cpu-affinity", why=BINDING),
    _valued("--gpu_ids", "--gpu-ids", action="gpu_ids"),
    _flag("-q", "--quiet", why=MESSAGES),
    _flag("-m", "--module", action="module"),
    _flag("--no_python", "--no-python", action="no_python"),
    _valued("--config_file", "--config-file", action="refuse",
            why="its settings reach Accelerator() only through accelerate launch, which trainctl replaces: "
                "set them in the program (Accelerator(mixed_precision=..., ...)) and drop --config_file"),
)
ACCELERATE_CONFIG = Dropped("accelerate config's default file",
                            "read only by accelerate launch: set its settings in the program (Accelerator(...))")

# deepspeed/launcher/runner.py, parse_args.
DEEPSPEED = _options(
    _valued("--num_nodes", action="nodes"),
    _valued("--num_gpus", "--num_accelerators", action="ranks_per_node"),
    *(_valued(*names, why=HOSTS) for names in (("-H", "--hostfile"), ("--launcher",), ("--launcher_args",),
                                               ("--ssh_port",))),
    *(_flag(name, why=HOSTS) for name in ("--no_ssh", "--no_ssh_check", "--force_multi")),
    *(_valued(name, why=RENDEZVOUS) for name in ("--master_addr", "--master_port", "--node_rank")),
    *(_valued(*names, action="refuse",
              why="picks hosts and GPU slots; trainctl runs on the nodes Slurm allocates and the gate passes: drop "
                  "it (nodes: --partition or --sbatch=--constraint=...; GPUs: --gpus-per-node)")
      for names in (("-i", "--include"), ("-e", "--exclude"))),
    *(_valued(name, why="used only with --elastic_training") for name in ("--min_elastic_nodes", "--max_elastic_nodes")),
    _flag("--elastic_training", action="refuse",
          why="DeepSpeed's elastic training is not run by trainctl: drop it (--min-nodes and --retries keep a job "
              "going without a bad node)"),
    _flag("--module", action="module"),
    _flag("--no_python", action="no_python"),
    _flag("--no_local_rank", action="use_env", why=LOCAL_RANK_ENV),
    _flag("--save_pid", why="the launcher's pid file: no launcher process runs"),
    _valued("--enable_each_rank_log", why=OUTPUT),
    _valued("--autotuning", action="refuse",
            why="the autotuner runs its experiments through the deepspeed launcher: run it outside trainctl"),
    _flag("--bind_cores_to_rank", why=BINDING),
    _valued("--bind_core_list", why=BINDING),
    _valued("--venv_script", action="refuse",
            why="activate the environment in a wrapper script that execs the program, and give trainctl that script"),
    _valued("--log_level", why=MESSAGES),
    _flag("-q", "--quiet", why=MESSAGES),
)


class _Launcher(NamedTuple):
    name: str
    family: str                          # "torch", "accelerate" or "deepspeed"
    options: dict[str, Option]
    abbreviations: bool                  # argparse's allow_abbrev: a unique prefix of a long option names it
    local_rank: tuple[str, str] = ()     # the --local-rank=N it passes each script, and the option that stops it
    python: str = ""                     # the Python that was named to run it (python -m ...)


# `python -m MODULE` that runs a launcher, by MODULE.
_TORCH_LOCAL_RANK = ("--local-rank=N", "--use-env")
_DEEPSPEED_LOCAL_RANK = ("--local_rank=N", "--no_local_rank")
_MODULES = {
    "torch.distributed.run": _Launcher("python -m torch.distributed.run", "torch", TORCHRUN, True),
    "torch.distributed.launch": _Launcher("python -m torch.distributed.launch", "torch", TORCH_LAUNCH, True,
                                          _TORCH_LOCAL_RANK),
    "accelerate.commands.launch": _Launcher("python -m accelerate.commands.launch", "accelerate", ACCELERATE, False),
    "deepspeed.launcher.runner": _Launcher("python -m deepspeed.launcher.runner", "deepspeed", DEEPSPEED, True,
                                           _DEEPSPEED_LOCAL_RANK),
}
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
# python(1)'s options that take a value (the next word, or attached: -Wignore).
_PYTHON_VALUED = ("-W", "-X")


def _basename(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def is_python(word: str) -> bool:
    """Whether `word` names a Python interpreter (python, python3.12, /opt/env/bin/python)."""
    return bool(_PYTHON.fullmatch(_basename(word)))


def translate(argv: tuple[str, ...] | list[str], *, placed: bool = False) -> Translation | Refusal | None:
    """`argv` with its launcher translated; a Refusal; None when `argv` starts with no launcher.
    `placed`: the job's node and rank counts are decided elsewhere (a job script's #SBATCH lines),
    so the launcher's are dropped, whatever they say (`$SLURM_NNODES` included), not carried."""
    argv = tuple(argv)
    if not argv:
        return None
    if _basename(argv[0]) == "srun":
        start = next((i for i in range(1, len(argv)) if _launcher_at(argv[i:]) is not None), None)
        if start is None:
            return Refusal("srun", "srun in the program would start a job step from every rank: give trainctl the "
                                   "program srun runs, without srun (trainctl starts one rank per GPU with its own srun)")
        inner = translate(argv[start:], placed=placed)
        if isinstance(inner, Translation):
            return inner._replace(dropped=(Dropped(" ".join(argv[:start]), SRUN), *inner.dropped))
        return inner
    found = _launcher_at(argv)
    if found is None:
        return None
    launcher, rest = found
    return _translate(launcher, rest, placed)


def _launcher_at(argv: tuple[str, ...]) -> tuple[_Launcher, tuple[str, ...]] | None:
    """The launcher `argv` starts with, and the words after its name; None for any other program."""
    name = _basename(argv[0])
    if name == "torchrun":
        return _Launcher("torchrun", "torch", TORCHRUN, True), argv[1:]
    if name == "deepspeed":
        return _Launcher("deepspeed", "deepspeed", DEEPSPEED, True, _DEEPSPEED_LOCAL_RANK), argv[1:]
    if name == "accelerate-launch":
        return _Launcher("accelerate-launch", "accelerate", ACCELERATE, False), argv[1:]
    if name == "accelerate" and argv[1:2] == ("launch",):
        return _Launcher("accelerate launch", "accelerate", ACCELERATE, False), argv[2:]
    if is_python(name):
        return _python_module(argv)
    return None


def _python_module(argv: tuple[str, ...]) -> tuple[_Launcher, tuple[str, ...]] | None:
    """`python [OPTIONS] -m MODULE ...` where MODULE is a launcher."""
    i = 1
    while i < len(argv) and argv[i].startswith("-") and not argv[i].startswith("-m"):
        i += 2 if argv[i] in _PYTHON_VALUED else 1
    if i >= len(argv) or not argv[i].startswith("-m"):
        return None
    module, rest = (argv[i][2:], argv[i + 1:]) if argv[i] != "-m" else (argv[i + 1] if i + 1 < len(argv) else "",
                                                                        argv[i + 2:])
    if module not in _MODULES:
        return None
    return _MODULES[module]._replace(python=argv[0]), rest


def _translate(launcher: _Launcher, words: tuple[str, ...], placed: bool = False) -> Translation | Refusal:
    parsed = _parse(launcher, words)
    if isinstance(parsed, Refusal):
        return parsed
    given, program = parsed
    if not program:
        return Refusal(launcher.name, f"{launcher.name} without a training script: put the script (or -m MODULE) "
                                      "and its arguments after the launcher's options")
    translation = Translation(launcher.name, program)
    module = no_python = use_env = False
    for option, written, value in given:
        action = option.action
        if action == "refuse":
            return Refusal(launcher.name, f"{launcher.name} {written.split('=')[0]}: {option.why}")
        if action == "module":
            module = True
        elif action == "no_python":
            no_python = True
        elif placed and action in ("nnodes", "nproc", "nodes", "ranks_per_node", "total_ranks"):
            translation = translation._replace(dropped=(*translation.dropped, Dropped(written, PLACEMENT)))
        elif action == "drop" or action == "use_env":
            use_env |= action == "use_env"
            translation = translation._replace(dropped=(*translation.dropped, Dropped(written, option.why)))
        else:
            counted = _count(launcher.name, action, written, value)
            if isinstance(counted, Refusal):
                return counted
            translation = counted(translation)
    if launcher.local_rank and not use_env:
        argument, flag = launcher.local_rank
        return Refusal(launcher.name, f"{launcher.name} passes {argument} on each rank's command line, which one "
                                      f"command line for every rank cannot: if the script reads LOCAL_RANK from the "
                                      f"environment, add {flag}")
    if launcher.family == "accelerate":
        translation = translation._replace(dropped=(*translation.dropped, ACCELERATE_CONFIG))
    return _program(launcher, translation, module, no_python)


def _program(launcher: _Launcher, translation: Translation, module: bool, no_python: bool) -> Translation | Refusal:
    """The program each rank runs, as the launcher would have run it."""
    script, args = translation.program[0], translation.program[1:]
    if no_python:
        if module:
            return Refusal(launcher.name, f"{launcher.name}: a module (-m) needs Python: drop --no-python or -m")
        if script.endswith(".py"):
            return Refusal(launcher.name, f"{launcher.name} --no-python {script}: trainctl runs a .py program under "
                                          "Python; give it a name without .py, or drop --no-python")
        return translation
    program = (PYTHON_MODULE, script, *args) if module else (script, *args)
    if launcher.python:      # the Python the user named runs the program, as the launcher ran it
        program = (launcher.python, *program)
    elif not module and not script.endswith(".py"):
        return Refusal(launcher.name, f"{launcher.name} runs {script} under Python, trainctl runs a program whose "
                                      f"name ends in .py under Python: give trainctl `python {script} ...`")
    return translation._replace(program=program)


def _count(name: str, action: str, written: str, value: str):
    """How a count option sets the translation (a function of it), or a Refusal."""
    if action == "nnodes":
        low, sep, high = value.partition(":")
        if not (low.isdigit() and (not sep or high.isdigit())) or int(low) < 1 or (sep and int(high) < int(low)):
            return Refusal(name, f"{name} {written}: expected N or MIN:MAX nodes")
        nodes, fewest = int(high or low), int(low)
        return lambda t: t._replace(nodes=nodes, min_nodes=fewest if sep else None, mapped=(*t.mapped, ("nodes", written)))
    if action == "nproc" and value in ("auto", "gpu"):
        return lambda t: t._replace(dropped=(*t.dropped, Dropped(written, LAYOUT)))
    if action == "gpu_ids":
        if value == "all":
            return lambda t: t._replace(dropped=(*t.dropped, Dropped(written, LAYOUT)))
        return Refusal(name, f"{name} {written}: trainctl gives local rank i the node's i-th GPU of Slurm's "
                             "allocation: drop it (--gpus-per-node sets how many)")
    if not value.isdigit() or int(value) < 1:
        if action == "nproc":
            return Refusal(name, f"{name} {written}: trainctl runs one rank per GPU (one per node without GPUs): "
                                 "give a number of GPUs, or drop it")
        return Refusal(name, f"{name} {written}: expected a number of at least 1")
    field = {"nproc": "ranks_per_node", "ranks_per_node": "ranks_per_node", "nodes": "nodes",
             "total_ranks": "total_ranks"}[action]
    return lambda t: t._replace(**{field: int(value)}, mapped=(*t.mapped, (field, written)))


def _parse(launcher: _Launcher, words: tuple[str, ...]):
    """(the options given, each (Option, as written, value), and the program after them), or a Refusal."""
    given: list[tuple[Option, str, str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        found = _lookup(launcher, word)
        if isinstance(found, Refusal):
            return found
        option, name, attached = found
        if option.takes_value:
            if attached is None:
                if i + 1 >= len(words):
                    return Refusal(launcher.name, f"{launcher.name} {name}: expected a value")
                attached, written = words[i + 1], f"{word} {words[i + 1]}"
                i += 1
            else:
                written = word
        elif attached is not None:
            return Refusal(launcher.name, f"{launcher.name} {name}: takes no value")
        else:
            written = word
        given.append((option, written, attached or ""))
        i += 1
    return given, words[i:]


def _lookup(launcher: _Launcher, word: str) -> tuple[Option, str, str | None] | Refusal:
    """The option `word` names (as argparse finds it), the name as written, and a value written with it."""
    options = launcher.options
    if word.startswith("--"):
        name, sep, value = word.partition("=")
        attached = value if sep else None
        if name not in options and launcher.abbreviations:
            matches = {options[known] for known in options if known.startswith(name) and known.startswith("--")}
            if len(matches) == 1:
                return matches.pop(), name, attached
            if len(matches) > 1:
                return Refusal(launcher.name, f"{launcher.name} {name}: ambiguous, it could be "
                                              + " or ".join(sorted(m.names[0] for m in matches)))
        if name in options:
            return options[name], name, attached
        return _unknown(launcher, name)
    name = word[:2]
    if name not in options:
        return _unknown(launcher, name)
    return options[name], name, (word[2:] or None) if options[name].takes_value else (
        None if len(word) == 2 else word[2:])


def _unknown(launcher: _Launcher, name: str) -> Refusal:
    if launcher.family == "accelerate":
        return Refusal(launcher.name, f"{launcher.name} {name}: trainctl runs the program without accelerate launch, "
                                      "which hands this setting to Accelerator() through the environment: set it in "
                                      "the program (Accelerator(...)) and drop it")
    return Refusal(launcher.name, f"{launcher.name} {name}: not an option of {launcher.name} that trainctl knows: "
                                  "drop it, or give trainctl the training script and its arguments without the launcher")
