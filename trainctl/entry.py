"""The `trainctl` executable and `python -m trainctl`: stop signals are caught before anything
else is imported, so Ctrl-C in the first tenth of a second (while Click and the command's
modules load) is the same one line and exit code as later, never a KeyboardInterrupt traceback.

Nothing has been started yet when this handler runs, so it leaves at once. `trainctl.cli.main`
installs the real handler (trainctl.signals) as soon as it runs.
"""

import os
import signal


def _stopped_early(signum: int, frame: object) -> None:
    name = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    os.write(2, f"trainctl: {name}\n".encode())
    os._exit(128 + signum)   # EXIT_SIGNAL_BASE + N, as trainctl.errors documents


for _signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_signum, _stopped_early)


def run() -> int:
    from trainctl.cli import main

    return main()
