"""One warning per process at most, whatever goes wrong how often: the program's log is not ours."""

import _warnings

_warned = False


def warn_once(message: str) -> None:
    """Through the warnings machinery, so a program can filter it; one that turns warnings into
    errors still gets no exception from here."""
    global _warned
    if _warned:
        return
    _warned = True
    try:
        _warnings.warn(f"trainctl: {message}", RuntimeWarning, stacklevel=3)
    except Exception:
        pass
