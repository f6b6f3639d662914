"""The committed dpgate/v1 code is exactly what protoc generates from proto/, and the schema
documents every element (buf schema consumers read these comments)."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "proto"
PROTO_FILES = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in PROTO_ROOT.rglob("*.proto"))
GENERATED = ROOT / "dpgate" / "v1"


def protoc(*args: str) -> None:
    command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}", *args, *PROTO_FILES]
    subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)


@pytest.mark.e2e
def test_protoc_reproduces_the_committed_files_byte_for_byte(tmp_path):
    protoc(f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}")
    produced = sorted(p.name for p in (tmp_path / "dpgate" / "v1").iterdir())
    committed = sorted(p.name for p in GENERATED.iterdir() if p.name != "__init__.py" and p.suffix in (".py", ".pyi"))
    assert produced == committed
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "dpgate" / "v1", GENERATED, produced, shallow=False)
    assert (mismatch, errors) == ([], []), "regenerate with: python -m grpc_tools.protoc (see README)"


def schema_elements(file: descriptor_pb2.FileDescriptorProto) -> Iterator[tuple[tuple[int, ...], str]]:
    """(source path, name) of every service, rpc, message, field, oneof, enum and enum value."""

    def message_elements(message: descriptor_pb2.DescriptorProto, path: tuple[int, ...], prefix: str):
        yield path, prefix
        for i, field in enumerate(message.field):
            yield (*path, 2, i), f"{prefix}.{field.name}"
        for i, oneof in enumerate(message.oneof_decl):
            if not oneof.name.startswith("_"):  # synthetic oneofs of proto3 `optional`
                yield (*path, 8, i), f"{prefix}.{oneof.name}"
        for i, nested in enumerate(message.nested_type):
            if not nested.options.map_entry:
                yield from message_elements(nested, (*path, 3, i), f"{prefix}.{nested.name}")
        for i, enum in enumerate(message.enum_type):
            yield from enum_elements(enum, (*path, 4, i), f"{prefix}.{enum.name}")

    def enum_elements(enum: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...], prefix: str):
        yield path, prefix
        for i, value in enumerate(enum.value):
            yield (*path, 2, i), f"{prefix}.{value.name}"

    for i, message in enumerate(file.message_type):
        yield from message_elements(message, (4, i), message.name)
    for i, enum in enumerate(file.enum_type):
        yield from enum_elements(enum, (5, i), enum.name)
    for i, service in enumerate(file.service):
        yield (6, i), service.name
        for j, method in enumerate(service.method):
            yield (6, i, 2, j), f"{service.name}.{method.name}"


def undocumented_elements(tmp_path: Path) -> list[str]:
    out = tmp_path / "schema.binpb"
    protoc("--include_source_info", f"--descriptor_set_out={out}")
    missing = []
    for file in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        documented = {tuple(loc.path) for loc in file.source_code_info.location if loc.leading_comments.strip()}
        missing += [f"{file.name}: {name}" for path, name in schema_elements(file) if path not in documented]
    return missing


@pytest.mark.e2e
def test_every_schema_element_has_a_documentation_comment(tmp_path):
    assert undocumented_elements(tmp_path) == []


def test_the_schema_defines_both_services_with_their_rpcs():
    from dpgate.v1 import control_pb2, generate_pb2

    inference = generate_pb2.DESCRIPTOR.services_by_name["InferenceService"]
    control = control_pb2.DESCRIPTOR.services_by_name["ControlService"]
    assert [m.name for m in inference.methods] == ["Generate", "GenerateStream", "Chat", "ChatStream"]
    assert inference.methods_by_name["GenerateStream"].server_streaming
    assert inference.methods_by_name["ChatStream"].server_streaming
    assert not inference.methods_by_name["Chat"].server_streaming
    assert [m.name for m in control.methods] == [
        "GetServerInfo", "GetModelInfo", "GetLoad", "Abort", "ResetPrefixCache", "WatchKvEvents", "GetTokenizer"
    ]  # fmt: skip
    assert control.methods_by_name["WatchKvEvents"].server_streaming
