"""`python -m trainctl`: the same as the `trainctl` executable."""

import sys

from trainctl.entry import run  # first: it installs the stop-signal handlers before any other import

sys.exit(run())
