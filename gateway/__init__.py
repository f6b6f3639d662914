"""The dpgate front door: an async gRPC gateway that routes each call to one data-parallel engine.

The pure core (metadata parsing, routing, health state, configuration) imports neither grpc nor
asyncio and is tested in milliseconds; the async parts (the HTTP/2 front door and relay, the
engine pool, commands) are built on top of it.
"""

from gateway import compiled

# The data path's compiled form, where `python -m gateway.mypyc_build` built one for these sources
# (gateway/compiled.py): looked for before any of its modules is imported.
compiled.install()
