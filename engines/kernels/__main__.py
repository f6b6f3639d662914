"""`python -m engines.kernels`: build the kernel library now (./dev.sh install does) and print its path."""

import sys

from engines.kernels.build import KernelBuildError, build

try:
    print(build(verbose=True))
except KernelBuildError as error:
    print(f"dpgate: {error}", file=sys.stderr)
    sys.exit(1)
