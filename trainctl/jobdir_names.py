"""The two names of a job's directory that code outside the job room needs: the directory's own
(the job script makes it, `trainctl submit` points to it, the fleet history finds journals in
it) and its journal's. Every other name in it is `trainctl.job.jobdir`'s, which takes these two
from here.
"""

DIR_PREFIX = "trainctl-gate-"            # + the job id, in the submit directory
JOURNAL = "journal.jsonl"


def dir_name(job_id: str) -> str:
    return f"{DIR_PREFIX}{job_id}"
