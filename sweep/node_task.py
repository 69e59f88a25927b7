"""The part of a sweep that runs on each node (one Slurm task per node, or one SSH session).

It runs `trainctl health check --json` under a deadline and prints the envelope the sweep
parses:

    {"node": "gpu03", "job_id": "4711", "outcome": "checked", "exit_code": 2,
     "duration_s": 1.9, "report": {...health check JSON...}, "detail": ""}

`outcome` is "checked", "timeout" (the checks outran the deadline: recorded apart from a
failing check) or "error" (no verdict, `detail` says why). With --fabric-timeout every task
then joins `trainctl health fabric --json`, and rank 0 prints a second envelope
{"node", "fabric": {...}}. The task exits 0 whenever it printed its envelope, so one bad
node never ends the step.

srun cuts lines longer than its 1 KiB I/O buffer and interleaves the pieces of different
tasks, so an envelope travels as numbered short lines, each one JSON object:
{"node", "msg", "part", "parts", "data"}, `data` being a slice of the zlib-compressed,
base64-encoded envelope (see `sweep.collect.Reassembler`).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import zlib

from trainctl.proc import ProcResult, run
from trainctl.slurm import this_node_name

STDERR_TAIL_CHARS = 300
PIECE_CHARS = 700           # keeps each printed line well under srun's 1024-byte buffer
CHECKS_MSG, FABRIC_MSG = 0, 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainctl.sweep.node_task")
    parser.add_argument("--timeout", type=float, required=True, help="seconds the checks may take")
    parser.add_argument("--site", help="site name or file for `health check`")
    parser.add_argument("--partition", help="partition of --site whose expectations apply")
    parser.add_argument("--only", required=True, help="comma-separated checks or families for `health check`")
    parser.add_argument("--fabric-timeout", type=float,
                        help="also run `health fabric` with this deadline (all tasks of the step)")
    args = parser.parse_args(argv)
    node = this_node_name()
    trainctl = [sys.executable, "-m", "trainctl.cli"]
    site = ["--site", args.site] if args.site else []
    site += ["--partition", args.partition] if args.partition else []

    check_argv = [*trainctl, "health", "check", "--json", *site, "--only", args.only]
    emit(node, CHECKS_MSG, {"node": node, "job_id": os.environ.get("SLURM_JOB_ID", ""),
                            **interpret(run(check_argv, timeout=args.timeout), args.timeout)})

    if args.fabric_timeout:
        # The fabric test keeps its own deadline; the margin covers its start-up and report.
        fabric = run([*trainctl, "health", "fabric", "--json", "--timeout", f"{args.fabric_timeout:g}", *site],
                     timeout=args.fabric_timeout + 30)
        if os.environ.get("SLURM_PROCID", "0") == "0":
            verdict = interpret(fabric, args.fabric_timeout + 30)
            emit(node, FABRIC_MSG, {"node": node, "fabric": verdict})
    return 0


def emit(node: str, msg: int, envelope: dict) -> None:
    """Print `envelope` as pieces no srun buffer can cut (one write, so pieces stay in order)."""
    data = base64.b64encode(zlib.compress(json.dumps(envelope).encode())).decode()
    slices = [data[i:i + PIECE_CHARS] for i in range(0, len(data), PIECE_CHARS)] or [""]
    sys.stdout.write("".join(json.dumps({"node": node, "msg": msg, "part": i, "parts": len(slices),
                                         "data": piece}) + "\n" for i, piece in enumerate(slices)))
    sys.stdout.flush()


def interpret(result: ProcResult, timeout_s: float) -> dict:
    """outcome/exit_code/duration_s/report/detail for one `trainctl health ... --json` run."""
    base = {"exit_code": result.returncode, "duration_s": round(result.duration_s, 3)}
    if result.timed_out:
        return {**base, "outcome": "timeout", "report": None,
                "detail": f"checks did not finish within {timeout_s:g} s"}
    try:
        report = json.loads(result.stdout)
        if not isinstance(report, dict) or "status" not in report:
            raise ValueError("not a health verdict")
    except ValueError:
        last_words = (result.stderr.strip().splitlines() or [""])[-1][-STDERR_TAIL_CHARS:]
        if result.missing or result.exec_error:
            why = result.describe_failure()
        elif result.returncode != 0:
            why = f"`{' '.join(result.argv[3:5])}` exited with status {result.returncode}"
        else:
            why = f"`{' '.join(result.argv[3:5])}` printed no JSON verdict"
        return {**base, "outcome": "error", "report": None,
                "detail": f"{why}: {last_words}" if last_words and result.returncode is not None else why}
    return {**base, "outcome": "checked", "report": report, "detail": ""}


def run_main(argv: list[str] | None = None) -> int:
    """`main`, with bad input from the node's environment (a hostlist no Slurm could hold in
    SLURM_JOB_NODELIST) as one line and its exit code, which srun hands to the sweep."""
    from trainctl.errors import TrainctlError
    from trainctl.text import printable

    try:
        return main(argv)
    except TrainctlError as exc:
        print(f"trainctl node task: error: {printable(str(exc))}", file=sys.stderr, flush=True)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(run_main())
