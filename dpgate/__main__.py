"""`python -m dpgate ...`: the `dpgate` command without its console script (CI, a bare checkout)."""

import sys

from dpgate.cli import main

sys.exit(main())
