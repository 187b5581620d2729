"""The one router (serve/http/router.py) and the front door's checks (serve/http/front_door.py) in process, with
httpx's ASGI transport in front of tiny handlers."""

import anyio
import httpx
import pytest

from contract.errors import ClientError
from serve.http.endpoint import BENTOML, HANDOFF, Answer, Endpoint, RouteTable
from serve.http.form import small_integer
from serve.http.front_door import MULTIPART, BodyRoute, FrontDoor, Slots
from serve.http.router import Router

FIELDS = {"image": "file", "top_k": "integer"}


async def count_body(request):
    return Answer(str(len(request.body)).encode(), "text/plain")


async def never_called(scope, receive, send):
    raise AssertionError("a route's bodies must not reach the app")


def router(
    handler, media_types=frozenset({MULTIPART}), app=never_called, max_concurrency=4, body_timeout_s=5, max_bytes=1000
):
    table = [
        Endpoint("POST", "/classify", "", HANDOFF, handler, BodyRoute(media_types, FIELDS)),
        Endpoint("GET", "/info", "", HANDOFF, handler),
        Endpoint("GET", "/livez", "", BENTOML),
    ]
    return Router(app, RouteTable(table, "m"), FrontDoor(max_bytes, max_concurrency, body_timeout_s))


def make_client(
    max_concurrency: int = 4, body_timeout_s: float = 5, handler=count_body, app=never_called, max_bytes: int = 1000
):
    door = router(handler, app=app, max_concurrency=max_concurrency, body_timeout_s=body_timeout_s, max_bytes=max_bytes)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=door), base_url="http://t")


async def post(client, **kwargs):
    return await client.post("/classify", **kwargs)


@pytest.mark.parametrize(
    "kwargs, status, words",
    [
        ({"files": {"image": ("a.png", b"x" * 2000)}}, 413, "larger than the limit"),
        ({"content": b"hi", "headers": {"content-type": "text/plain"}}, 415, "multipart/form-data"),
        ({"files": {"file": ("a.png", b"x")}}, 400, "unknown field"),
        ({"files": {"image": ("a.png", b"x")}, "data": {"top_k": "9" * 50}}, 400, "whole number"),
        ({"files": [("image", ("a.png", b"x")), ("image", ("b.png", b"y"))]}, 400, "2 times"),
        ({"files": {"image": (None, "text")}}, 400, "must be a file upload"),
        ({"files": {"image": ("a.png", b"x")}, "data": {"top_k": "3"}}, 200, ""),
    ],
)
def test_each_check(kwargs, status, words):
    async def go():
        async with make_client() as client:
            return await post(client, **kwargs)

    response = anyio.run(go)
    assert response.status_code == status and words in response.text


def test_requests_over_the_limit_get_429_while_others_are_served():
    release = anyio.Event()

    async def slow(request):
        await release.wait()
        return Answer(b"ok", "text/plain")

    async def go():
        statuses = []
        async with make_client(max_concurrency=2, handler=slow) as client:
            async with anyio.create_task_group() as tasks:

                async def one():
                    statuses.append((await post(client, files={"image": ("a.png", b"x")})).status_code)

                for _ in range(5):
                    tasks.start_soon(one)
                await anyio.sleep(0.2)
                release.set()
        return sorted(statuses)

    assert anyio.run(go) == [200, 200, 429, 429, 429]


def test_an_image_route_gets_the_file_and_its_parameters_from_either_body():
    """Form and raw body reach the route's own handler alike: the image's bytes and its parameters."""
    seen = []

    async def handler(request):
        seen.append((request.body, request.params))
        return Answer(b"ok", "text/plain")

    async def go():
        door = router(handler, frozenset({MULTIPART, "image/png"}))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=door), base_url="http://t") as client:
            form = await client.post("/classify", files={"image": ("a.png", b"PNGDATA")}, data={"top_k": "3"})
            raw = await client.post("/classify?top_k=2", content=b"RAW", headers={"content-type": "image/png"})
            bare = await client.post("/classify", files={"image": ("a.png", b"X")})
        return form.status_code, raw.status_code, bare.status_code

    assert anyio.run(go) == (200, 200, 200)
    assert seen == [(b"PNGDATA", {"top_k": ["3"]}), (b"RAW", {"top_k": ["2"]}), (b"X", {})]


def test_a_post_to_a_path_without_a_body_route_is_never_read():
    """POST /livez (or /, or a typo) is answered 404 with its body unread: it holds no reading slot and no
    memory, whoever sends it. Here every reading slot is taken by stalled uploads meanwhile."""
    reads = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 405, "headers": []})
        await send({"type": "http.response.body", "body": b"no"})

    async def counting_receive():
        reads.append(1)
        return {"type": "http.request", "body": b"x", "more_body": True}

    async def go():
        door = router(count_body, app=app, max_concurrency=1)
        door.front_door.reading = Slots(0)  # every reading slot taken
        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/livez", "headers": [(b"content-length", b"999")]}
        await door(scope, counting_receive, send)
        return sent[0]["status"]

    assert anyio.run(go) == 404 and reads == []


def test_both_framings_are_refused_and_the_connection_closed():
    async def go():
        async with make_client() as client:
            return await client.post(
                "/classify", content=b"0\r\n\r\n", headers={"transfer-encoding": "chunked", "content-length": "5"}
            )

    response = anyio.run(go)
    assert response.status_code == 400 and "Transfer-Encoding and Content-Length" in response.json()["error"]
    assert response.headers["connection"] == "close"


def test_an_unexpected_error_is_a_500_at_once_with_the_cause_logged(caplog):
    async def broken(request):
        int("²")  # str.isdigit() says yes; int() says no

    async def go():
        async with make_client(handler=broken) as client:
            return await post(client, files={"image": ("a.png", b"x")})

    with caplog.at_level("ERROR"):
        response = anyio.run(go)
    assert response.status_code == 500 and "log" in response.json()["error"]
    assert "unexpected error" in caplog.text and "ValueError" in caplog.text


def test_a_client_error_is_answered_in_one_place_and_bentomls_rows_go_to_bentoml():
    """A handler raises the one client error wherever the request is found wrong; the router answers it."""
    bentoml_saw = []

    async def refuse(request):
        raise ClientError("no such thing here", 422)

    async def app(scope, receive, send):
        bentoml_saw.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"live"})

    async def go():
        async with make_client(handler=refuse, app=app) as client:
            return await client.get("/info"), await client.get("/livez"), await client.get("/nothing")

    info, live, nothing = anyio.run(go)
    assert info.status_code == 422 and info.json() == {"error": "no such thing here"}
    assert live.text == "live" and bentoml_saw == ["/livez"]
    assert nothing.status_code == 404 and "docs.json" in nothing.json()["error"]


@pytest.mark.parametrize(
    "text, ok", [("5", True), ("+12", True), ("²", False), ("①", False), ("٣", False), ("1" * 7, False)]
)
def test_small_integers_are_ascii_digits(text, ok):
    assert small_integer(text) is ok


def test_a_text_orjson_refuses_is_still_answered_as_valid_json():
    """send_json writes with orjson, which refuses a lone surrogate; the standard library escapes it."""
    import json

    from serve.http.front_door import send_json

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    anyio.run(send_json, send, 400, {"error": "bad name \udc80"})
    body = sent[1]["body"]
    assert json.loads(body) == {"error": "bad name \udc80"}
    assert dict(sent[0]["headers"])[b"content-length"] == str(len(body)).encode()
