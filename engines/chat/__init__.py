"""Chat on the engine: templates, thinking, output parsing, tool calls (docs/engine.md, "Chat")."""
