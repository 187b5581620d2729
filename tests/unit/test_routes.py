"""The route table (serve/routes.py) and what is made from it: the front door's routes, the app's, the paths
open without a key, the /metrics paths and the OpenAPI document; and the service's BentoML tracing setting."""

from __future__ import annotations

from serve.endpoint import APP, BENTOML, FRONT_DOOR, app_routes, body_routes, known_paths, open_paths, openapi_document
from serve.oip import ProtocolSurface
from serve.routes import CLASSIFY_FIELDS, DETECT_FIELDS, endpoints
from serve.tracing import EVERY_URL, service_tracing

TABLE = endpoints(ProtocolSurface("digits", "1", lambda: None), "handoff", "0.1.0")


def test_every_post_is_read_by_the_front_door_and_every_get_by_the_app_or_bentoml():
    for e in TABLE:
        assert (e.answered_by == FRONT_DOOR) == (e.method == "POST" and e.documented), e
        assert (e.handler is None) == (e.answered_by == BENTOML), e
    routes = body_routes(TABLE, "digits")
    assert set(routes) == {
        "/classify",
        "/detect",
        "/segment",
        "/predict",
        "/v2/models/digits/infer",
        "/v2/models/digits/versions/1/infer",
    }
    assert (
        routes["/classify"].form_fields == CLASSIFY_FIELDS
        and routes["/detect"].form_fields == DETECT_FIELDS == routes["/segment"].form_fields
    )
    served = {route.path for route in app_routes(TABLE)}
    assert served == {e.path for e in TABLE if e.answered_by == APP}


def test_the_probes_and_the_page_are_open_and_nothing_that_holds_data():
    assert open_paths(TABLE, "digits") == {
        "/",
        "/livez",
        "/readyz",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/digits/ready",
        "/v2/models/digits/versions/1/ready",
    }
    assert not {"/info", "/classify", "/detect", "/segment", "/predict", "/metrics"} & open_paths(TABLE, "digits")


def test_metrics_know_each_documented_path_for_the_served_model_and_no_catch_all():
    paths = known_paths(TABLE, "digits")
    assert {"/classify", "/v2/models/digits/infer", "/v2/models/digits/versions/1/config"} <= paths
    assert not any("{" in path for path in paths)


def test_the_openapi_document_has_every_documented_row_and_the_forms_fields():
    document = openapi_document(TABLE, "handoff", "0.1.0")
    listed = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert listed == {(e.method, e.path) for e in TABLE if e.documented}
    classify = document["paths"]["/classify"]["post"]
    form = classify["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert set(form["properties"]) == set(CLASSIFY_FIELDS) and form["required"] == ["image"]
    assert "image/jpeg" in classify["requestBody"]["content"] and classify["parameters"][0]["name"] == "top_k"
    assert "security" not in document["paths"]["/livez"]["get"] and "security" in classify
    operation_ids = [op["operationId"] for item in document["paths"].values() for op in item.values()]
    assert len(operation_ids) == len(set(operation_ids))


def test_spans_are_left_out_unless_the_users_bentoml_configuration_traces(tmp_path):
    assert service_tracing({}) == {"excluded_urls": EVERY_URL}
    traced = "tracing.exporter_type=otlp tracing.sample_rate=0.1 tracing.otlp.protocol=http"
    assert service_tracing({"BENTOML_CONFIG_OPTIONS": traced}) == {}
    assert service_tracing({"BENTOML_CONFIG_OPTIONS": "tracing.exporter_type=otlp"}) == {"excluded_urls": EVERY_URL}
    config = tmp_path / "bentoml.yaml"
    config.write_text(
        "version: 2\nservices:\n  handoff:\n    tracing:\n      exporter_type: zipkin\n      sample_rate: 1\n"
    )
    assert service_tracing({"BENTOML_CONFIG": str(config)}) == {}
    config.write_text("tracing: [not, a, mapping\n")
    assert service_tracing({"BENTOML_CONFIG": str(config)}) == {"excluded_urls": EVERY_URL}
