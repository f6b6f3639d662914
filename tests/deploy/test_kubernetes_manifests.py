"""deploy/kubernetes/: valid Kubernetes objects that agree with the dpgate command they run.

Schemas come from kubernetes-validate (offline, strict: unknown fields are errors), the flags from
the real argparse parsers of `dpgate engine` and `dpgate gateway`, and the values through the same
config validation the commands run at start, so a manifest cannot name a flag that does not exist,
probe a port the process does not listen on, or disagree with itself about the DP size.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dpgate.cli import command_parser
from engines import config as engine_config
from engines.config import EngineConfig
from gateway.gateway_command import config_from_args
from gateway.server import LIVENESS_SERVICE

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
# The Kubernetes version the manifests are checked against; .ci/run checks the same one.
KUBERNETES_VERSION = "1.33.0"


def load(name: str) -> dict[str, Any]:
    (document,) = yaml.safe_load_all((MANIFESTS / name).read_text())
    return document


def resource_files() -> list[str]:
    return load("kustomization.yaml")["resources"]


def objects() -> dict[str, dict[str, Any]]:
    """Every object the kustomization applies, by kind/name."""
    found = {}
    for name in resource_files():
        document = load(name)
        found[f"{document['kind']}/{document['metadata']['name']}"] = document
    return found


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return only


def parse(args: list[str]) -> tuple[str, argparse.Namespace]:
    """The container's args as `dpgate` (the image's ENTRYPOINT) parses them; a bad flag fails the test."""
    command, *flags = args
    _, parser = command_parser(command)
    try:
        return command, parser.parse_args(flags)
    except SystemExit:
        pytest.fail(f"`dpgate {' '.join(args)}` is refused by the {command} command's parser")


def grpc_probes(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    kinds = ("startupProbe", "readinessProbe", "livenessProbe")
    return {kind: spec[kind]["grpc"] for kind in kinds if kind in spec}


@pytest.fixture(scope="module")
def manifest() -> dict[str, dict[str, Any]]:
    return objects()


def test_the_kustomization_lists_every_manifest_in_the_folder():
    on_disk = sorted(path.name for path in MANIFESTS.glob("*.yaml") if path.name != "kustomization.yaml")
    assert sorted(resource_files()) == on_disk


@pytest.mark.parametrize("name", resource_files())
def test_each_manifest_is_a_valid_kubernetes_object_in_strict_mode(name):
    kubernetes_validate.validate(load(name), KUBERNETES_VERSION, strict=True)


def test_strict_validation_refuses_a_misspelt_field(manifest):
    gateway = copy.deepcopy(manifest["Deployment/dpgate-gateway"])
    container(gateway)["readinessProbe"]["periodSecond"] = 5
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(gateway, KUBERNETES_VERSION, strict=True)


def test_engine_args_are_engine_flags_and_every_ordinal_is_a_valid_rank(manifest, monkeypatch):
    engines = manifest["StatefulSet/dpgate-engine"]
    spec = container(engines)
    assert spec["image"].split(":")[0] == "dpgate"
    command, args = parse(spec["args"])
    assert command == "engine" and args.data_parallel_rank_from_hostname
    replicas = engines["spec"]["replicas"]
    assert replicas == args.data_parallel_size, "StatefulSet replicas must equal --data-parallel-size"
    name = engines["metadata"]["name"]
    ranks = []
    for ordinal in range(replicas):
        monkeypatch.setattr(engine_config.socket, "gethostname", lambda ordinal=ordinal: f"{name}-{ordinal}")
        config = EngineConfig.from_args(args)
        config.validate()
        ranks.append(config.data_parallel_rank)
    assert ranks == list(range(replicas))


def test_gateway_args_are_gateway_flags_and_find_the_engines_service(manifest):
    gateway = manifest["Deployment/dpgate-gateway"]
    assert gateway["spec"]["replicas"] == 2
    spec = container(gateway)
    assert spec["image"].split(":")[0] == "dpgate"
    command, args = parse(spec["args"])
    assert command == "gateway"
    config = config_from_args(args)
    _, engine_args = parse(container(manifest["StatefulSet/dpgate-engine"])["args"])
    headless = manifest["Service/dpgate-engine"]
    assert headless["spec"]["clusterIP"] == "None"
    assert config.engine_dns_targets == ((headless["metadata"]["name"], engine_args.port),)
    assert [port["port"] for port in headless["spec"]["ports"]] == [engine_args.port]
    assert manifest["StatefulSet/dpgate-engine"]["spec"]["serviceName"] == headless["metadata"]["name"]
    grace = gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > config.shutdown_timeout_s > config.drain_grace_s


@pytest.mark.parametrize("workload", ["StatefulSet/dpgate-engine", "Deployment/dpgate-gateway"])
def test_probes_are_grpc_health_on_the_port_the_args_set(manifest, workload):
    spec = container(manifest[workload])
    _, args = parse(spec["args"])
    probes = grpc_probes(spec)
    assert {"readinessProbe", "livenessProbe"} <= probes.keys()
    container_ports = {port["containerPort"] for port in spec["ports"]}
    for probe in probes.values():
        assert probe["port"] == args.port and probe["port"] in container_ports
    assert "resources" in spec and {"requests", "limits"} <= spec["resources"].keys()
    if workload.startswith("Deployment"):
        # A gateway waiting for engines is not ready ("") but alive: liveness asks the other name.
        assert probes["livenessProbe"]["service"] == LIVENESS_SERVICE
        assert probes["readinessProbe"].get("service", "") == ""


def test_services_and_budgets_select_their_pods(manifest):
    pods = {
        component: manifest[workload]["spec"]["template"]["metadata"]["labels"]
        for component, workload in (("engine", "StatefulSet/dpgate-engine"), ("gateway", "Deployment/dpgate-gateway"))
    }
    for key, document in manifest.items():
        if document["kind"] in ("Service", "PodDisruptionBudget", "StatefulSet", "Deployment"):
            selector = document["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            component = selector["app.kubernetes.io/component"]
            assert selector.items() <= pods[component].items(), key
    for workload in ("StatefulSet/dpgate-engine", "Deployment/dpgate-gateway"):
        names = {port["name"] for port in container(manifest[workload])["ports"]}
        component = manifest[workload]["metadata"]["labels"]["app.kubernetes.io/component"]
        service = manifest[f"Service/dpgate-{component}"]
        assert {port["targetPort"] for port in service["spec"]["ports"]} <= names
    assert {"PodDisruptionBudget/dpgate-engine", "PodDisruptionBudget/dpgate-gateway"} <= manifest.keys()


def test_engines_and_gateways_share_the_engine_token_from_a_secret(manifest):
    """Engines refuse calls without the token (dpgate/engine_token.py); both read it from one Secret."""
    for name in ("StatefulSet/dpgate-engine", "Deployment/dpgate-gateway"):
        env = {item["name"]: item for item in container(manifest[name]).get("env", [])}
        source = env["DPGATE_ENGINE_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert source == {"name": "dpgate-engine-token", "key": "token"}, name  # not optional: pods wait for it


def test_only_gateway_pods_may_reach_the_engines_grpc_port(manifest):
    policy = manifest["NetworkPolicy/dpgate-engine"]
    engine = manifest["StatefulSet/dpgate-engine"]
    gateway = manifest["Deployment/dpgate-gateway"]
    assert policy["spec"]["podSelector"]["matchLabels"] == engine["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    grpc_port = next(p["containerPort"] for p in container(engine)["ports"] if p["name"] == "grpc")
    rules = [rule for rule in policy["spec"]["ingress"] if any(p["port"] == grpc_port for p in rule["ports"])]
    assert len(rules) == 1
    (peer,) = rules[0]["from"]
    assert peer == {"podSelector": {"matchLabels": gateway["spec"]["template"]["metadata"]["labels"]}}
    open_ports = {p["port"] for rule in policy["spec"]["ingress"] if "from" not in rule for p in rule["ports"]}
    assert grpc_port not in open_ports
