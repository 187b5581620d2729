"""The route table (serve/routes.py) and what is made from it: the router's matcher, the paths open without a key,
the /metrics paths and the OpenAPI document; and the service's BentoML tracing setting."""

from __future__ import annotations

from serve.endpoint import BENTOML, HANDOFF, RouteSchema, known_paths, open_paths, openapi_document, route_matcher
from serve.oip import ProtocolSurface
from serve.routes import CLASSIFY_FIELDS, DETECT_FIELDS, endpoints
from serve.tracing import EVERY_URL, service_tracing

TABLE = endpoints(ProtocolSurface("digits", "1", lambda: None), "handoff", "0.1.0")


def test_every_route_is_answered_by_one_router_from_the_table():
    """Every row but BentoML's probes has its handler here; every POST that documents a body is read by the front
    door first; a request for another model's infer is matched by no row (never read)."""
    for e in TABLE:
        assert (e.handler is None) == (e.answered_by == BENTOML), e
        assert (e.body is not None) == (e.method == "POST" and e.documented), e
    match = route_matcher(TABLE, "digits")
    bodies = {path for path in ("/classify", "/detect", "/segment", "/predict") if match("POST", path)[0].body}
    assert bodies == {"/classify", "/detect", "/segment", "/predict"}
    for path in ("/v2/models/digits/infer", "/v2/models/digits/versions/1/infer"):
        assert match("POST", path)[0].body is not None
    assert match("POST", "/v2/models/other/infer")[0].body is None  # the protocol's JSON 404, body unread
    assert match("POST", "/livez") is None and match("GET", "/junk") is None
    row, params = match("GET", "/v2/models/digits/versions/1/ready")
    assert row.answered_by == HANDOFF and params == {"name": "digits", "version": "1"}
    assert match("HEAD", "/info")[0].path == "/info"
    assert match("GET", "/readyz")[0].answered_by == BENTOML
    classify = match("POST", "/classify")[0].body
    assert classify.form_fields == CLASSIFY_FIELDS and match("POST", "/detect")[0].body.form_fields == DETECT_FIELDS


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


def test_a_task_contributes_its_own_request_and_answer_schemas():
    body = {"type": "object", "properties": {"inputs": {"type": "object"}}, "required": ["inputs"]}
    own = {"/predict": RouteSchema({"application/json": {"schema": body}}, ("application/json", {"type": "object"}))}
    predict = openapi_document(TABLE, "handoff", "0.1.0", own)["paths"]["/predict"]["post"]
    assert predict["requestBody"]["content"]["application/json"]["schema"]["required"] == ["inputs"]
    generic = openapi_document(TABLE, "handoff", "0.1.0")["paths"]["/predict"]["post"]
    assert "required" not in generic["requestBody"]["content"]["application/json"]["schema"]


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
