"""dpgate's Python client library: blocking and asyncio clients of the dpgate.v1 schema.

`from dpgate.client import DpgateClient, GenerationOptions`; the clients are in clients.py, their
options, results, streams and chat types beside it (docs/client.md). The public names are
clients.py's `__all__`.
"""

from dpgate.client.clients import *  # noqa: F403 (the public surface is clients.__all__)
from dpgate.client.clients import __all__ as __all__
