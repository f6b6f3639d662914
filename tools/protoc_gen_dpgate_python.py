"""A buf plugin that produces exactly what `python -m grpc_tools.protoc` produces.

buf's own compiler fills `json_name` in every field descriptor it hands to plugins, while protoc
leaves it unset unless the schema sets it. The Python generator embeds the serialized descriptor,
so buf's built-in plugins would commit different bytes than protoc does. This plugin clears the
json_name buf added, hands the descriptors to grpc_tools' bundled protoc through
`--descriptor_set_in`, and returns protoc's files unchanged. Both paths then agree byte for byte,
which is what lets CI prove the committed code is current with either tool.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2

PROTOC_OUTPUTS = ("--python_out", "--pyi_out", "--grpc_python_out")


def clear_json_names(message: descriptor_pb2.DescriptorProto) -> None:
    """Unset json_name on every field of `message` and of its nested messages."""
    for field in (*message.field, *message.extension):
        field.ClearField("json_name")
    for nested in message.nested_type:
        clear_json_names(nested)


def as_protoc_would_see(files: list[descriptor_pb2.FileDescriptorProto]) -> descriptor_pb2.FileDescriptorSet:
    """Copy the request's file descriptors with the fields protoc would not have set cleared."""
    descriptor_set = descriptor_pb2.FileDescriptorSet()
    for proto_file in files:
        copy = descriptor_set.file.add()
        copy.CopyFrom(proto_file)
        for message in copy.message_type:
            clear_json_names(message)
        for extension in copy.extension:
            extension.ClearField("json_name")
    return descriptor_set


def run_protoc(request: plugin_pb2.CodeGeneratorRequest) -> plugin_pb2.CodeGeneratorResponse:
    """Generate the requested files with grpc_tools' protoc and wrap them in a plugin response."""
    response = plugin_pb2.CodeGeneratorResponse(
        supported_features=plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL
    )
    with tempfile.TemporaryDirectory() as work:
        descriptors = Path(work, "descriptors.binpb")
        descriptors.write_bytes(as_protoc_would_see(list(request.proto_file)).SerializeToString())
        out = Path(work, "out")
        out.mkdir()
        command = [sys.executable, "-m", "grpc_tools.protoc", f"--descriptor_set_in={descriptors}"]
        command += [f"{flag}={out}" for flag in PROTOC_OUTPUTS]
        command += list(request.file_to_generate)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            response.error = result.stderr.strip() or f"protoc exited with status {result.returncode}"
            return response
        for path in sorted(p for p in out.rglob("*") if p.is_file()):
            response.file.add(name=path.relative_to(out).as_posix(), content=path.read_text())
    return response


def main() -> None:
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    sys.stdout.buffer.write(run_protoc(request).SerializeToString())


if __name__ == "__main__":
    main()
