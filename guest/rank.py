"""This process as a watched rank: its reporter, with the activity sampler and the signal judge
started at its first step. Made at the first call (a report), never at import; None in every
process that is not a watched rank's own (`reporter`: the claim)."""

import os

from .activity import Sampler
from .reporter import Reporter, reporter_from_env
from .requests import RequestReader, reader_from_env
from .signal_judge import judge_from_env

_made = False
_reporter: Reporter | None = None
_requests: RequestReader | None = None
_sampler: Sampler | None = None


def the_rank() -> Reporter | None:
    global _made, _reporter, _sampler
    if not _made:
        _made = True
        _reporter = reporter_from_env(os.environ)
        if _reporter is not None:
            _sampler = Sampler(_reporter, judge_from_env(os.environ, _reporter.rank))
            _reporter.first_step_hooks.append(_sampler.start)
    return _reporter


def claimed_rank() -> Reporter | None:
    """The reporter where this process already reported as the rank (its first step); a save never
    makes the claim, so a data loader or a converter that saves claims nothing."""
    return _reporter


def requests() -> RequestReader | None:
    """The watch's checkpoint requests, for any process of the job that asks (made at the first ask)."""
    global _requests
    if _requests is None:
        _requests = reader_from_env(os.environ)
    return _requests
