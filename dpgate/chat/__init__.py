"""Chat prompts as the engine renders them: the template's Jinja environment, the thinking rule,
tool definitions and the messages of a dpgate.v1 ChatRequest. Pure (jinja2 and protobuf, no torch,
no transformers), so the gateway renders the very prompt the engine will run and hashes its blocks."""
