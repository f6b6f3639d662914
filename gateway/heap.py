"""Large freed buffers go back to the system, so a flood of big request bodies leaves no trace.

glibc serves an allocation at or above its mmap threshold (128 KiB at start) from a mapping of its
own, unmapped when freed. But its dynamic rule raises the threshold to the size of the largest such
block freed (up to 32 MiB): after the first 4 MB request body is freed, later bodies of that size
come from the main heap, which glibc trims only from its top, and small allocations made
between them pin it. 100 streams each sending 3.9 MB left the gateway 160-210 MB larger after
they had all ended (issue 22); a Python loop doing the same kept 400 of 412 MB. Setting the
threshold explicitly turns the dynamic rule off: the same loop then returns to 15 MB.
"""

from __future__ import annotations

import ctypes
import logging

logger = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value, kept fixed


def keep_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at `threshold`; False where the C library has no mallopt (musl's
    is a no-op returning 0), which is then logged once at debug level."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        logger.debug("no mallopt in this C library: the heap keeps its own threshold")
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))
