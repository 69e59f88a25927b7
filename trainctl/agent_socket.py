"""Where a node's ranks send their progress: the one path rank-exec gives them and the node agent binds.

Both ends compute it from the job id and the node's Slurm name, so nothing has to be handed
from one to the other. It lies in the user's private directory on the node
(`trainctl.private_dir`), which either end makes when it is not there yet and both check before
use; the agent's copy of the watch's checkpoint requests lies beside it. It lives here, in the
core, because rank-exec (launcher/) may not import the job room (job/), where the agent is.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

from trainctl.private_dir import FALLBACK_BASE, UnsafeDir, base_dir, ensure, private_dir_path
from trainctl.guest.wire import SOCKET_ENV, WATCH_DIR_ENV

# sockaddr_un's sun_path holds 108 bytes on Linux, the terminating NUL included (unix(7)).
MAX_SOCKET_PATH_BYTES = 107


def agent_socket_path(job_id: str, node: str, environ: Mapping[str, str] = os.environ,
                      uid: int | None = None) -> str:
    """`$TMPDIR/trainctl-UID/progress-[CLUSTER-]JOB-NODE.sock` (/tmp without TMPDIR); a hash of the
    names where that path is too long for a Unix socket, under /tmp if even that is too long. Pure:
    the directory is neither made nor checked here.

    A path-named socket is a file, seen by every network namespace of the host: the cluster's
    name (SLURM_CLUSTER_NAME, set in every step's environment: srun(1)) keeps apart two clusters
    whose slurmds share a host and number their jobs alike (several slurmd on one host, as the
    dev cluster runs them)."""
    uid = os.geteuid() if uid is None else uid
    directory = private_dir_path(base_dir(environ), uid)
    cluster = environ.get("SLURM_CLUSTER_NAME", "")
    names = f"{cluster}-{job_id}-{node}" if cluster else f"{job_id}-{node}"
    path = os.path.join(directory, f"progress-{names}.sock")
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH_BYTES:
        return path
    digest = hashlib.sha256(f"{cluster}\0{job_id}\0{node}".encode()).hexdigest()[:24]
    short = os.path.join(directory, f"progress-{digest}.sock")
    if len(os.fsencode(short)) <= MAX_SOCKET_PATH_BYTES:
        return short
    return os.path.join(private_dir_path(FALLBACK_BASE, uid), f"progress-{digest}.sock")


def progress_environment(environ: Mapping[str, str], node: str) -> tuple[dict[str, str], str]:
    """(what rank-exec adds to a rank's environment so that it reports its progress, why nothing
    where it should have). The agent's socket, only in a step the supervisor watches
    (WATCH_DIR_ENV set) and inside a job, and only when the socket's directory is the user's
    alone (made here when the agent has not made it yet): else no socket and the refusal."""
    job_id = environ.get("SLURM_JOB_ID")
    if not environ.get(WATCH_DIR_ENV) or not job_id:
        return {}, ""
    path = agent_socket_path(job_id, node, environ)
    try:
        ensure(os.path.dirname(path))
    except UnsafeDir as exc:
        return {}, str(exc)
    return {SOCKET_ENV: path}, ""
