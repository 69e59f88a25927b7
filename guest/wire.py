"""What the rank and trainctl share: the environment's names, the node-local file names, and the
progress datagram the node agent reads (`trainctl.job.agent`).

Standard library underscore modules only (the room's rule 4): the agent and the supervisor import
these names from here, so both ends of every file and datagram agree.
"""

import _struct

SOCKET_ENV = "TRAINCTL_PROGRESS_SOCKET"     # the node agent's socket: set only in a watched step
WATCH_DIR_ENV = "TRAINCTL_WATCH_DIR"         # the supervisor's watch folder for that step
INTERVAL_ENV = "TRAINCTL_PROGRESS_INTERVAL_S"
RANK_ENV = "RANK"
STEP_ID_ENV = "SLURM_STEP_ID"                # a restart in the allocation is a new step: a new rank process
SIGNAL_ENV = "TRAINCTL_CHECKPOINT_SIGNAL"    # the job's --signal, as a number, when it has one
CHECKPOINT_ENV = "TRAINCTL_CHECKPOINT_FILE"  # the file whose mtime says when the program last saved
AUTO_STEPS_ENV = "TRAINCTL_AUTO_STEPS"       # "0" turns the optimizer step hook off for one job

DEFAULT_INTERVAL_S = 0.05
# A longer interval would leave the watch without news for longer than its hang floors allow.
MAX_INTERVAL_S = 10.0

# Beside the agent's socket, in the job user's private directory on the node:
REQUEST_SUFFIX = ".checkpoint-request"       # the token of the watch's last checkpoint request
CLAIM_INFIX = ".rank-"                       # <socket>.rank-R.step-S: which process is rank R's own

# In the watch folder:
LISTENING_FILE = "checkpoint-listening"      # some rank asks for requests: send it no signal
SIGNAL_REFUSED_FILE = "checkpoint-signal-refused"   # "rank R: why" the signal would not get a save

# One datagram: format version, rank, the sending process's pid (for the node's stack dumps),
# steps so far, wall time of the last step's end, steps in this report, their summed and longest
# duration, compute-section seconds in this report, the step the last checkpoint holds
# (-1: none reported), and how often the main thread was seen somewhere new (activity).
# Little-endian, fixed size.
RECORD = _struct.Struct("<BiiQdIdddqQ")
VERSION = 3
RANKS = range(-1, 2**31)             # what the rank field holds (-1: RANK not set)
CHECKPOINT_STEPS = range(0, 2**63)   # what the checkpoint field holds
WINDOW_STEPS_MAX = 2**32 - 1


# One save the rank's program made (`save_hooks`), sent when it completes: a datagram of its own,
# tagged apart from the progress datagram by its first byte. The format's tag, rank, the sending
# process's pid, the wall time the save completed, which API made it (SAVE_APIS' index), then the
# path it wrote, as the file system's bytes (at most SAVE_PATH_MAX; a longer one is cut there).
SAVE_RECORD = _struct.Struct("<BiidB")
SAVE_TAG = 0x80 | VERSION
SAVE_APIS = ("torch.save", "torch.distributed.checkpoint", "safetensors", "lightning")
SAVE_PATH_MAX = 4096
DATAGRAM_MAX = SAVE_RECORD.size + SAVE_PATH_MAX   # the longest datagram a rank sends


def request_path(socket_path: str) -> str:
    """The node-local file holding the last checkpoint request's token, beside the agent's socket."""
    return socket_path + REQUEST_SUFFIX


def claim_path(socket_path: str, rank: int, step_id: str) -> str:
    """What the first process of rank `rank` in Slurm step `step_id` makes to say it is the rank (a directory)."""
    return f"{socket_path}{CLAIM_INFIX}{rank}.step-{step_id}"


def claims_prefix(socket_path: str) -> str:
    """What every claim beside `socket_path` starts with (the agent removes them at its end)."""
    return socket_path + CLAIM_INFIX


def decode(datagram: bytes) -> dict[str, float | int]:
    """One datagram as a dict (for the agent and tests); ValueError if it is not one."""
    if len(datagram) != RECORD.size:
        raise ValueError(f"progress datagram of {len(datagram)} bytes, expected {RECORD.size}")
    version, rank, pid, steps, wall, n, total, longest, compute_s, checkpoint_step, activity = \
        RECORD.unpack(datagram)
    if version != VERSION:
        raise ValueError(f"progress datagram version {version}, expected {VERSION}")
    return {"rank": rank, "pid": pid, "steps": steps, "time": wall, "window_steps": n, "window_seconds": total,
            "window_longest": longest, "compute_seconds": compute_s, "checkpoint_step": checkpoint_step,
            "activity": activity}


def is_save(datagram: bytes) -> bool:
    return datagram[:1] == bytes((SAVE_TAG,))


def encode_save(rank: int, pid: int, wall: float, api: int, path: bytes) -> bytes:
    return SAVE_RECORD.pack(SAVE_TAG, rank, pid, wall, api) + path[:SAVE_PATH_MAX]


def decode_save(datagram: bytes) -> dict[str, float | int | str]:
    """One save datagram as a dict (for the agent and tests); ValueError if it is not one."""
    if not SAVE_RECORD.size < len(datagram) <= DATAGRAM_MAX or not is_save(datagram):
        raise ValueError(f"not a save datagram ({len(datagram)} bytes)")
    _, rank, pid, wall, api = SAVE_RECORD.unpack_from(datagram)
    if api >= len(SAVE_APIS):
        raise ValueError(f"save datagram of unknown API {api}")
    path = datagram[SAVE_RECORD.size:].decode("utf-8", "replace")   # a note for people: no lone surrogates
    return {"rank": rank, "pid": pid, "time": wall, "api": SAVE_APIS[api], "path": path}
