"""dpgate: the generated `dpgate.v1` schema package, and the `dpgate` command line."""

__version__ = "0.1.0"
