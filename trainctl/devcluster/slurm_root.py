"""Another Slurm for the dev cluster: a Debian root filesystem with slurm-wlm 24.11 (Debian 13,
"trixie") or 26.05 (Debian's development suite, "sid"), built once from Debian's archive with
mmdebstrap and cached, in which munged, slurmctld, every slurmd, the Slurm clients and so every
job task run (chroot).

The root sees the host's paths that daemons, clients and tasks use at the same paths: /dev, /proc,
/sys (inside a node: the node's own sysfs), /tmp (configs, logs, spool, test folders), /etc/hosts,
the Python trainctl runs on (its venv, the installation the venv points to, the checkout holding
the venv: trainctl, the examples) and any `root_binds`. The mounts live in the cluster's base
dir (`<base>/root`, host mount namespace) and in each node's mount namespace, never in the
cached root itself, so several clusters share one cache. Client commands run the root's through
wrappers in `<base>/slurm-bin`, which `DevCluster.env()` puts first on PATH; inside the root (a
job's task, whose PATH came from the submitter) the same wrappers run the root's binary directly.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

from trainctl.devcluster.processes import CMD_TIMEOUT_S, binary
from trainctl.devcluster.spec import ROOT_SLURMS, SLURM_ROOTS, Layout
from trainctl.errors import ExternalCommandError, UsageError
from trainctl.proc import resolve, run, run_checked

DEBIAN_SUITE = {"24.11": "trixie", "26.05": "sid"}
# The Slurm packages' version where the suite moves: sid replaces a version as soon as a newer one
# is uploaded, so the tested one is pinned; once sid has moved on, build from a snapshot of the
# archive (--mirror https://snapshot.debian.org/archive/debian/<date>T000000Z/).
PINNED_SLURM = {"26.05": "26.05.5-1"}
SLURM_PACKAGES = ("slurm-wlm", "slurmctld", "slurmd", "slurm-client")
DEBIAN_MIRROR = "http://deb.debian.org/debian"
MARKER = "etc/trainctl-slurm-root"     # in the root: which Slurm it holds; absent on the host
BUILD_TIMEOUT_S = 1800.0
# The Slurm daemons and clients, munge, and what trainctl's probes and the pyenv Python the
# tasks run need from the root's /usr (the interpreter itself is bound in from the host).
ROOT_PACKAGES = (
    *SLURM_PACKAGES, "munge",
    "iproute2", "iputils-ping", "procps",
    "libssl3t64", "libffi8", "libsqlite3-0", "libbz2-1.0", "liblzma5", "libexpat1",
    "libreadline8t64", "libncursesw6", "zlib1g", "libtirpc3t64",
)
CLIENT_COMMANDS = ("sbatch", "srun", "salloc", "scontrol", "squeue", "sinfo", "scancel", "sacct",
                   "sattach", "sstat", "sprio", "sdiag")
CWD_COMMANDS = ("sbatch", "srun", "salloc")   # the caller's directory becomes the job's
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/var", "/boot")
BUILD_HINT = ("build it once: scripts/setup --slurm {slurm} "
              "(or trainctl dev-cluster build-root --slurm {slurm})")


# ---------------------------------------------------------------- build (scripts/setup)

def root_release(root: str | Path) -> str | None:
    """The Slurm release a built root holds (its marker), None when there is no built root."""
    try:
        return (Path(root) / MARKER).read_text().split()[0]
    except (OSError, IndexError):
        return None


def check_root(slurm: str, root: str) -> None:
    found = root_release(root)
    if found != slurm:
        what = f"holds Slurm {found}" if found else "is not built"
        raise ExternalCommandError(f"the Slurm {slurm} root {root} {what}",
                                   hint=BUILD_HINT.format(slurm=slurm))


def mmdebstrap_argv(slurm: str, target: str, mirror: str = DEBIAN_MIRROR) -> list[str]:
    pinned = PINNED_SLURM.get(slurm)
    packages = [f"{p}={pinned}" if pinned and p in SLURM_PACKAGES else p for p in ROOT_PACKAGES]
    # A development suite's Release file is valid for a week (Valid-Until), and a snapshot of the
    # archive is past it by design: apt then refuses the suite unless told not to check that date
    # (apt.conf(5), Acquire::Check-Valid-Until); the signature is still checked and the Slurm
    # packages are pinned.
    expiry = ['--aptopt=Acquire::Check-Valid-Until "false"'] if pinned else []
    return ["mmdebstrap", "--variant=minbase", *expiry, f"--include={','.join(packages)}",
            DEBIAN_SUITE[slurm], target, mirror]


def build_root(slurm: str, root: str | None = None, *, mirror: str = DEBIAN_MIRROR,
               rebuild: bool = False, progress: Callable[[str], None] = lambda _m: None) -> bool:
    """Build the root for `slurm` at `root` (default: its cache, SLURM_ROOTS) unless it is there;
    True when it was built.

    Built beside `root` and renamed into place, so an interrupted build leaves no half root.
    """
    if slurm not in ROOT_SLURMS:
        raise UsageError(f"no root filesystem for Slurm {slurm!r}; choose {', '.join(ROOT_SLURMS)}")
    root = root or SLURM_ROOTS[slurm]
    if os.geteuid() != 0:
        raise UsageError("building the Slurm root needs root (mmdebstrap, chroot)")
    if root_release(root) == slurm and not rebuild:
        progress(f"Slurm {slurm} root {root} is built already")
        return False
    mmdebstrap = resolve("mmdebstrap")
    if mmdebstrap is None:
        raise ExternalCommandError("mmdebstrap: not found on PATH", hint="Debian: apt-get install mmdebstrap")
    staging = Path(f"{root}.building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    progress(f"building the Slurm {slurm} root from {mirror} (Debian {DEBIAN_SUITE[slurm]}) ...")
    result = run([mmdebstrap, *mmdebstrap_argv(slurm, str(staging), mirror)[1:]], timeout=BUILD_TIMEOUT_S)
    if not result.ok:
        shutil.rmtree(staging, ignore_errors=True)
        raise ExternalCommandError(f"mmdebstrap failed: {result.describe_failure()}")
    version = run_checked([binary("chroot"), str(staging), "/usr/sbin/slurmd", "-V"],
                          timeout=CMD_TIMEOUT_S).stdout.split()
    if len(version) < 2 or not version[1].startswith(f"{slurm}."):
        shutil.rmtree(staging, ignore_errors=True)
        raise ExternalCommandError(f"the root's slurmd says {' '.join(version)!r}, not Slurm {slurm}")
    (staging / "etc/hosts").touch()  # a mount point for the host's
    (staging / MARKER).write_text(f"{slurm} {version[1]}\n")
    if os.path.lexists(root):
        shutil.rmtree(root)
    staging.rename(root)
    progress(f"Slurm {version[1]} root built in {time.monotonic() - start:.0f} s, "
             f"{disk_usage_bytes(Path(root)) / 2**20:.0f} MiB at {root}")
    return True


def disk_usage_bytes(path: Path) -> int:
    """Bytes the files under `path` take on disk (hard links counted once), like `du -s`."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(folder, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


# ---------------------------------------------------------------- host paths the root sees

def host_binds(extra: tuple[str, ...] = (), python_prefix: str = sys.prefix,
               python_base: str = sys.base_prefix) -> list[str]:
    """Directories bound into the root at the same path: /tmp, the Python running trainctl (its
    venv, the installation behind it, the checkout holding the venv) and `extra`; none nested in
    another, none of the root's own system directories (the root has its own /usr)."""
    wanted = ["/tmp", *extra]
    venv = os.path.realpath(python_prefix)
    wanted += [venv, os.path.realpath(python_base)]
    if venv != os.path.realpath(python_base):   # a venv: its checkout holds trainctl's examples
        wanted.append(os.path.dirname(venv))
    chosen: list[str] = []
    for path in sorted({p.rstrip("/") for p in wanted}, key=len):
        if path == "" or any(path == d or path.startswith(d + "/") for d in SYSTEM_DIRS):
            continue
        if not any(path == c or path.startswith(c + "/") for c in chosen):
            chosen.append(path)
    return sorted(chosen)


def assemble_root(layout: Layout) -> None:
    """<base>/root: the cached root with the host's /dev, /proc, /sys, /etc/hosts and
    `host_binds` bound in (host mount namespace; node namespaces made later inherit it)."""
    spec = layout.spec
    check_root(spec.slurm, spec.root_fs)
    root = layout.root_dir
    root.mkdir(exist_ok=True)
    _mount("--bind", spec.root_fs, root)
    _mount("--make-private", root)
    for tree in ("/dev", "/proc", "/sys"):
        _mount("--rbind", tree, f"{root}{tree}")
    _mount("--bind", "/etc/hosts", f"{root}/etc/hosts")
    for path in host_binds(spec.root_binds):
        if not os.path.isdir(path):
            raise UsageError(f"{path}: no such directory to bind into the Slurm root")
        # /tmp alone, not its submounts: it holds <base>/root itself
        os.makedirs(f"{root}{path}", exist_ok=True)  # a mount point in the cached root
        _mount("--bind", path, f"{root}{path}")
    _mount("--make-rprivate", root)  # unmounting these copies must never reach the host's


def mount_node_root(layout: Layout, node: str) -> None:
    """Inside `node`'s mount namespace: the root's /sys is the node's own sysfs and its
    local bin dir is the node's (as outside the root; see replay.py)."""
    root = layout.root_dir
    for argv in (["mount", "--rbind", "/sys", f"{root}/sys"],
                 ["mount", "--bind", str(layout.node_bin_dir(node)), f"{root}{layout.local_bin_dir}"]):
        run_checked(layout.exec_argv(node, argv), timeout=CMD_TIMEOUT_S)


def _mount(*args: object) -> None:
    run_checked(["mount", *map(str, args)], timeout=CMD_TIMEOUT_S)


# ---------------------------------------------------------------- daemons and clients

def in_root(layout: Layout, argv: list[str]) -> list[str]:
    """`argv` (absolute paths inside the root) run in the cluster's root."""
    return [binary("chroot"), str(layout.root_dir), *argv]


def client_wrapper_text(layout: Layout, command: str) -> str:
    """A client command that runs the root's `command` in the caller's directory.

    sbatch, srun and salloc make the caller's directory the job's: where the root does not
    see it, they refuse. The others do not use it and run from / there.
    """
    root = layout.root_dir
    chroot = binary("chroot")
    if command in CWD_COMMANDS:
        elsewhere = (f'  echo "{command}: $PWD is not visible inside the dev cluster\'s Slurm root; '
                     'work under /tmp or the checkout, or add it with dev-cluster up --bind DIR" >&2\n'
                     '  exit 1\n')
    else:
        elsewhere = '  cd /\n'
    return ("#!/bin/sh\n"
            f"# Generated by trainctl dev-cluster: Slurm {layout.spec.slurm}'s {command}, from {root}.\n"
            f"# Inside the root (a job's task) run it directly; {root} is empty there.\n"
            f'[ -e /{MARKER} ] && exec /usr/bin/{command} "$@"\n'
            f'if [ ! -d "{root}$PWD" ]; then\n'
            f"{elsewhere}"
            "fi\n"
            f'exec {chroot} {root} /usr/bin/env --chdir="$PWD" /usr/bin/{command} "$@"\n')


def write_client_wrappers(layout: Layout) -> None:
    folder = layout.slurm_bin_dir
    folder.mkdir(exist_ok=True)
    for command in CLIENT_COMMANDS:
        wrapper = folder / command
        wrapper.write_text(client_wrapper_text(layout, command))
        wrapper.chmod(0o755)
