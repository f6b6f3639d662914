"""dpgate's Python client library: blocking and asyncio clients of the dpgate.v1 schema."""
