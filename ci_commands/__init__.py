"""Pull-request comment commands (``/ci run`` and friends) that steer dpgate's Buildkite CI.

The package is split so that every decision that matters for safety -- which comment is a
command, who may run it, which build belongs to which pull request -- lives in pure modules
(`commands`, `authorize`, `ownership`, `pulls`, `replies`) that take plain data and can be
tested in milliseconds; the HTTP clients and the dispatcher only gather facts and act.
"""
