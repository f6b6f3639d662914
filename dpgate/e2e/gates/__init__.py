"""Accuracy gates of `dpgate e2e`: each a `run(target) -> GateResult` (dpgate/e2e/contracts.py)."""
