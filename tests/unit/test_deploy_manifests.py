"""deploy/'s manifests against the schemas a cluster checks them with, offline: deploy/kubernetes.yaml against
Kubernetes' own (kubernetes-validate ships them), deploy/kserve.yaml against KServe's InferenceService CRD, kept in
tests/schemas/ with its version. Both strict, as `kubectl apply` is (server-side field validation, Strict): an
unknown field is an error, not a field silently dropped. (tests/test_bento.py checks what the manifests say against
the service: ports, probe paths, settings.)"""

from __future__ import annotations

import copy
import gzip
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = "1.33"  # the oldest Kubernetes release still supported upstream when this was written
KSERVE_CRD = ROOT / "tests" / "schemas" / "kserve-v0.20.0-serving.kserve.io_inferenceservices.yaml.gz"
"""kserve/kserve's config/crd/full/serving.kserve.io_inferenceservices.yaml at tag v0.20.0 (commit 1fb7810), gzipped"""


def documents(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((ROOT / "deploy" / name).read_text()))


def strict(schema: Any) -> Any:
    """A CRD's schema closed as the API server's strict field validation reads it: an object that lists its
    properties takes no others, unless it says it keeps unknown fields."""
    if isinstance(schema, dict):
        closed = {key: strict(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            closed["additionalProperties"] = False
        return closed
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


@pytest.fixture(scope="module")
def inference_service_schema() -> dict[str, Any]:
    crd = yaml.load(gzip.open(KSERVE_CRD), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    return strict(version["schema"]["openAPIV3Schema"])


def kserve_errors(schema: dict[str, Any], document: dict[str, Any]) -> list[str]:
    assert document["apiVersion"] == "serving.kserve.io/v1beta1" and document["kind"] == "InferenceService"
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_the_kubernetes_manifest_is_valid_for_kubernetes():
    kinds = []
    for document in documents("kubernetes.yaml"):
        kubernetes_validate.validate(document, KUBERNETES, strict=True)
        kinds.append(document["kind"])
    assert kinds == ["Deployment", "Service"]


@pytest.mark.parametrize(
    "break_it, expected",
    [
        (lambda c: c.update(readinesProbe=c.pop("readinessProbe")), "'readinesProbe' was unexpected"),
        (lambda c: c["ports"][0].update(containerPort="3000/tcp"), "'3000/tcp' is not of type 'integer'"),
        (lambda c: c.pop("image") and c.pop("name"), "'name' is a required property"),
    ],
)
def test_a_kubernetes_manifest_a_cluster_would_refuse_fails(break_it, expected):
    deployment = copy.deepcopy(documents("kubernetes.yaml")[0])
    break_it(deployment["spec"]["template"]["spec"]["containers"][0])
    with pytest.raises(kubernetes_validate.ValidationError, match=expected):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def test_the_kserve_manifest_is_valid_for_kserve(inference_service_schema):
    (service,) = documents("kserve.yaml")
    assert kserve_errors(inference_service_schema, service) == []


@pytest.mark.parametrize(
    "break_it, expected",
    [
        (lambda p: p.update(scaleMetric="latency"), "spec.predictor.scaleMetric: 'latency' is not one of"),
        (lambda p: p.update(minReplica=1), "spec.predictor: Additional properties are not allowed ('minReplica'"),
        (lambda p: p["containers"][0].pop("name") and p["containers"][0]["ports"][0].pop("containerPort"),
         "spec.predictor.containers.0.ports.0: 'containerPort' is a required property"),
    ],
)  # fmt: skip
def test_a_kserve_manifest_a_cluster_would_refuse_fails(inference_service_schema, break_it, expected):
    (service,) = copy.deepcopy(documents("kserve.yaml"))
    break_it(service["spec"]["predictor"])
    errors = kserve_errors(inference_service_schema, service)
    assert any(error.startswith(expected) for error in errors), errors
