"""Slurm's accounting for the fleet tests that are not about it: what sacct would say of honest
journals (each job ran as its file's owner, on the nodes its journal names, from its start on).

The tests of the check itself read sacct's real output instead (tests/fixtures/sacct/).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from trainctl.slurm import SACCT_FIELDS, AccountedJob, fold_hostlist
from trainctl.sweep.fleet import JournalRefused, SlurmRecords, job_id_from_path, parse_journal_bytes

FAR_FUTURE = 4e9


def honest_records(paths) -> dict[str, AccountedJob]:
    """{job id: its record} as Slurm would have it for the jobs of these journals (unreadable ones left out)."""
    from trainctl.journal_events import JournalUnreadable, read_journal_file

    jobs: dict[str, AccountedJob] = {}
    for path in map(str, paths):
        try:
            data, owner = read_journal_file(path)
            parsed = parse_journal_bytes(data, named_job=job_id_from_path(path), site="", now=FAR_FUTURE)
        except (JournalRefused, JournalUnreadable):
            continue
        earlier = jobs.get(parsed.job_id)
        nodes = frozenset(event.host for event in parsed.events) | (earlier.nodes if earlier else frozenset())
        start = min(parsed.started_at, earlier.start) if earlier else parsed.started_at
        jobs[parsed.job_id] = AccountedJob(parsed.job_id, owner, nodes, start, None)
    return jobs


def slurm_vouching_for(paths) -> Callable[[list[str]], SlurmRecords]:
    """A fold's `ask`: Slurm's accounting agreeing with these journals."""
    jobs = honest_records(paths)
    return lambda job_ids: SlurmRecords({job: jobs[job] for job in job_ids if job in jobs})


def write_sacct(bin_dir: Path, paths) -> Path:
    """A `sacct` for the commands' tests: it answers `--jobs=...` in sacct's own --parsable2 form
    (the header and fields of tests/fixtures/sacct/slurm-22.05-jobs.txt) from `honest_records(paths)`."""
    lines = {job: f"{job}|{job}|{record.uid}|{fold_hostlist(sorted(record.nodes))}|{record.start:.0f}|Unknown|RUNNING"
             for job, record in honest_records(paths).items()}
    script = bin_dir / "sacct"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script.write_text(f"""#!{sys.executable}
import sys
lines = {lines!r}
asked = next(arg for arg in sys.argv if arg.startswith("--jobs=")).split("=", 1)[1].split(",")
print({"|".join(SACCT_FIELDS)!r})
for job in asked:
    if job in lines:
        print(lines[job])
""")
    script.chmod(0o755)
    return script
