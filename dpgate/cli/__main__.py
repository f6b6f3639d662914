"""`python -m dpgate.cli`: the `dpgate` command, as tests and benchmarks start it."""

import sys

from dpgate.cli import main

sys.exit(main())
