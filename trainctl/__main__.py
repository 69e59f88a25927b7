"""`python -m trainctl`: the same command as the `trainctl` script."""

import sys

from trainctl.cli import main

sys.exit(main())
