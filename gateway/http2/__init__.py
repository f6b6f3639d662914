"""A small HTTP/2 layer for the gateway's data path: frames, header blocks, and one connection class.

grpc.aio costs about 220 us of CPU per call side on the gateway's hot path (every completion
crosses from gRPC's threads to the event loop), so a proxied call paid for two full gRPC
stacks. Relaying gRPC at the HTTP/2 level inside one event loop costs a fraction of that: the
gateway reads headers, forwards DATA payloads as they are, and never parses a body.
"""
