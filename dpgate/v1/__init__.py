"""Python code generated from proto/dpgate/v1 (messages, .pyi stubs, gRPC stubs). Do not edit."""
