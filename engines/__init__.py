"""dpgate engines: a model runner, scheduler and sampler behind the dpgate.v1 gRPC services."""
