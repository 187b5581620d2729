"""The route table (serve/http/endpoint.py's `RouteTable`, the routes every model has in serve/http/routes.py, a served
task's added as it loads) and what is made from it: the router's matcher, the paths open without a key, the
/metrics paths and the OpenAPI document; the registries of tasks in agreement; and the service's BentoML tracing
setting."""

from __future__ import annotations

import inspect

import pytest

import contract.signature
from contract.errors import ClientError
from export.tasks import TASKS as EXPORT_TASKS
from serve.http.endpoint import BENTOML, HANDOFF, Answer, Endpoint, RouteTable, open_paths
from serve.http.routes import route_table
from serve.observability.tracing import EVERY_URL, service_tracing
from serve.protocols.oip import ProtocolSurface
from serve.tasks import TASKS as SERVED_TASKS
from serve.tasks.base import ServedTask, json_route
from serve.tasks.images import image_route


def table() -> RouteTable:
    return route_table(ProtocolSurface("digits", "1", lambda: None), dict, "handoff", "0.1.0", "digits")


async def answer(request):
    return Answer({})


CLASSIFY = image_route("/classify", "classes", answer, ("application/json", {}), {"image": "file", "top_k": "integer"})
PREDICT = json_route("/predict", "logits", answer, {"type": "object"}, max_bytes=1234)


def served(*rows: Endpoint, admit=lambda: None) -> RouteTable:
    routes = table()
    routes.serve("image-classification", list(rows), admit)
    return routes


def test_every_route_is_answered_by_one_router_from_the_table():
    """Every row but BentoML's probes has its handler here; every POST that documents a body is read by the front
    door first; a request for another model's infer is matched by no row (never read)."""
    routes = served(CLASSIFY, PREDICT)
    for e in routes.rows:
        assert (e.handler is None) == (e.answered_by == BENTOML), e
        assert (e.body is not None) == (e.method == "POST" and e.documented), e
    match = routes.match
    assert match("POST", "/classify")[0].body.form_fields == {"image": "file", "top_k": "integer"}
    assert match("POST", "/predict")[0].body.max_bytes == 1234
    for path in ("/v2/models/digits/infer", "/v2/models/digits/versions/1/infer"):
        assert match("POST", path)[0].body is not None
    assert match("POST", "/v2/models/other/infer")[0].body is None  # the protocol's JSON 404, body unread
    assert match("POST", "/livez") is None and match("GET", "/junk") is None and match("POST", "/detect") is None
    row, params = match("GET", "/v2/models/digits/versions/1/ready")
    assert row.answered_by == HANDOFF and params == {"name": "digits", "version": "1"}
    assert match("HEAD", "/info")[0].path == "/info"
    assert match("GET", "/readyz")[0].answered_by == BENTOML


def test_a_tasks_routes_come_when_it_loads_and_are_admitted_by_the_service():
    routes = table()
    assert routes.match("POST", "/classify") is None and "/classify" not in routes
    refusal = routes.unmatched("POST", "/classify")
    assert refusal.status == 404 and "GET /docs.json" in str(refusal)
    admitted = []
    routes.serve("image-classification", [CLASSIFY, PREDICT], lambda: admitted.append(1))
    assert "/classify" in routes and "/v2/models/digits/infer" in routes and "/detect" not in routes
    routes.match("POST", "/classify")[0].admit()
    assert admitted == [1]
    refusal = routes.unmatched("POST", "/detect")
    assert refusal.status == 404 and "POST /classify or POST /predict" in str(refusal), refusal
    with pytest.raises(ValueError, match="declared twice"):
        table().serve("x", [CLASSIFY, CLASSIFY], lambda: None)
    with pytest.raises(ValueError, match="/info"):
        table().serve("x", [Endpoint("GET", "/info", "", HANDOFF, answer)], lambda: None)


def test_a_model_that_did_not_load_answers_503_for_its_routes():
    routes = table()
    routes.failed("model.onnx: missing")
    refusal = routes.unmatched("POST", "/classify")
    assert isinstance(refusal, ClientError) and refusal.status == 503 and "model.onnx: missing" in str(refusal)


def test_the_probes_and_the_page_are_open_and_nothing_that_holds_data():
    routes = served(CLASSIFY, PREDICT)
    assert open_paths(routes.rows, "digits") == {
        "/",
        "/livez",
        "/readyz",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/digits/ready",
        "/v2/models/digits/versions/1/ready",
    }
    assert open_paths(routes.rows, "digits") == open_paths(routes.common, "digits")


def test_metrics_know_each_documented_path_for_the_served_model_and_no_catch_all():
    paths = served(CLASSIFY, PREDICT).known_paths
    assert {"/classify", "/v2/models/digits/infer", "/v2/models/digits/versions/1/config"} <= paths
    assert not any("{" in path for path in paths)


def test_the_openapi_document_has_the_common_rows_and_the_served_tasks_alone():
    document = served(CLASSIFY, PREDICT).document("handoff", "0.1.0")
    listed = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    common = {(e.method, e.path) for e in table().rows if e.documented}
    assert listed == common | {("POST", "/classify"), ("POST", "/predict")}
    assert "/detect" not in document["paths"] and "/v1/chat/completions" not in document["paths"]
    classify = document["paths"]["/classify"]["post"]
    form = classify["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert set(form["properties"]) == {"image", "top_k"} and form["required"] == ["image"]
    assert "image/jpeg" in classify["requestBody"]["content"]
    assert "security" not in document["paths"]["/livez"]["get"] and "security" in classify
    operation_ids = [op["operationId"] for item in document["paths"].values() for op in item.values()]
    assert len(operation_ids) == len(set(operation_ids))


def test_the_registries_and_the_task_names_agree():
    """Every TASK_* name is served by one class and exported by at least one task, and nothing else is; every
    served task declares its routes (an abstract method: a class without them fails when it is made, at load)."""
    names = {value for name, value in vars(contract.signature).items() if name.startswith("TASK_")}
    assert set(SERVED_TASKS) == names
    assert {task.name for task in EXPORT_TASKS} == names
    for name, served_class in SERVED_TASKS.items():
        assert served_class.name == name and not inspect.isabstract(served_class), name
    assert "endpoints" in ServedTask.__abstractmethods__


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
