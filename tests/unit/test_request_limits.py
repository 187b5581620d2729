"""The request-limits middleware in process, with httpx's ASGI transport in front of a tiny app."""

import anyio
import httpx
import pytest

from serve.limits import RequestLimits

FIELDS = {"/classify": {"image": "file", "top_k": "integer"}}


def make_client(max_concurrency: int = 4, body_timeout_s: float = 5, app=None) -> httpx.AsyncClient:
    async def echo(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(body)).encode()})

    limits = RequestLimits(
        app or echo,
        max_bytes=1000,
        content_types={"/classify": "multipart/form-data"},
        form_fields=FIELDS,
        max_concurrency=max_concurrency,
        body_timeout_s=body_timeout_s,
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=limits), base_url="http://t")


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

    async def slow(scope, receive, send):
        await receive()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def go():
        statuses = []
        async with make_client(max_concurrency=2, app=slow) as client:
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

    async def handler(scope, image, params, send):
        seen.append((image, params))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def go():
        limits = RequestLimits(
            echo_never_called,
            max_bytes=1000,
            content_types={"/classify": "multipart/form-data"},
            form_fields=FIELDS,
            max_concurrency=4,
            body_timeout_s=5,
            image_routes={"/classify": (frozenset({"image/png"}), handler)},
        )
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=limits), base_url="http://t") as client:
            form = await client.post("/classify", files={"image": ("a.png", b"PNGDATA")}, data={"top_k": "3"})
            raw = await client.post("/classify?top_k=2", content=b"RAW", headers={"content-type": "image/png"})
            bare = await client.post("/classify", files={"image": ("a.png", b"X")})
        return form.status_code, raw.status_code, bare.status_code

    assert anyio.run(go) == (200, 200, 200)
    assert seen == [(b"PNGDATA", {"top_k": ["3"]}), (b"RAW", {"top_k": ["2"]}), (b"X", {})]


async def echo_never_called(scope, receive, send):
    raise AssertionError("an image route's bodies must not reach the app")
