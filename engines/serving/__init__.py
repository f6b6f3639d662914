"""The serving room: the gRPC server and servicers, wire conversion, the async engine loop and its metrics."""
