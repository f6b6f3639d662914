"""The accuracy gates of `dpgate e2e`: each module's `run(target) -> GateResult` judges a running
topology through its gateway (docs/accuracy.md says what each checks and why)."""
