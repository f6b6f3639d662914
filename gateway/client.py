"""`gateway.client`, where the client library lived before it left the server's package: kept as a
re-export of `dpgate.client` because code written against the README imports it from here."""

from dpgate.client import *  # noqa: F403 (the same names as dpgate.client)
from dpgate.client import __all__ as __all__
