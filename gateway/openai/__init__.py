"""The OpenAI-compatible HTTP API on the gateway (docs/http-api.md): its calls take the gRPC path."""
