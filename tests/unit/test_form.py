"""serve/form.py on bodies that real clients build (httpx's multipart encoder), and on broken ones."""

import os
import tempfile

import httpx
import pytest

from serve.form import MAX_PARTS, BadForm, read_form

FIELDS = {"image": "file", "top_k": "integer", "note": "text"}


def encoded(files=None, data=None) -> tuple[str, bytes]:
    """The Content-Type and body httpx sends for this form."""
    request = httpx.Request("POST", "http://t/classify", files=files, data=data)
    return request.headers["content-type"], request.read()


def spooled_to_disk(*args, **kwargs):
    raise AssertionError("a part was spooled to a temporary file")


def test_a_photo_over_a_megabyte_is_read_exactly_and_never_spooled_to_disk(monkeypatch):
    # Bytes that look like the start of a boundary inside the file must stay in it.
    photo = (b"\xff\xd8" + os.urandom(1_500_000) + b"\r\n--not-the-boundary\r\n\r\n") * 2
    content_type, body = encoded(files={"image": ("photo.jpg", photo, "image/jpeg")}, data={"top_k": "3"})
    monkeypatch.setattr(tempfile, "TemporaryFile", spooled_to_disk)  # what a spooled file rolls over to
    file, params = read_form(content_type, body, FIELDS)
    assert file == photo and params == {"top_k": ["3"]}


def test_text_fields_are_utf8():
    content_type, body = encoded(files={"image": ("a.png", b"x")}, data={"note": "café ①"})
    assert read_form(content_type, body, FIELDS)[1] == {"note": ["café ①"]}


def test_a_file_named_the_rfc_2231_way_is_a_file():
    body = part(b"image", b"x", b"; filename*=utf-8''%D1%84.jpg") + b"--B--\r\n"
    assert read_form("multipart/form-data; boundary=B", body, FIELDS) == (b"x", {})


def test_a_missing_optional_field_is_left_out():
    content_type, body = encoded(files={"image": ("a.png", b"")})
    assert read_form(content_type, body, FIELDS) == (b"", {})


def part(name: bytes, value: bytes, extra: bytes = b"") -> bytes:
    return b'--B\r\nContent-Disposition: form-data; name="' + name + b'"' + extra + b"\r\n\r\n" + value + b"\r\n"


@pytest.mark.parametrize(
    "content_type, body, words",
    [
        ("multipart/form-data", b"--B--\r\n", "no boundary"),
        ("multipart/form-data; boundary=B", b"--B\r\nno colon here\r\n\r\nx\r\n--B--\r\n", "malformed"),
        ("multipart/form-data; boundary=B", b"--B\r\nContent-Type: text/plain\r\n\r\nx\r\n--B--\r\n", '"name"'),
        ("multipart/form-data; boundary=B", b"", "missing file field 'image'"),
        ("multipart/form-data; boundary=B", part(b"image", b"x") + b"--B--\r\n", "must be a file upload"),
        (
            "multipart/form-data; boundary=B",
            part(b"image", b"x", b'; filename="a"') + part(b"top_k", b"1", b'; filename="b"') + b"--B--\r\n",
            "not a file",
        ),
        (
            "multipart/form-data; boundary=B",
            part(b"image", b"x", b'; filename="a"') + part(b"note", b"\xff\xfe") + b"--B--\r\n",
            "not UTF-8",
        ),
        (
            "multipart/form-data; boundary=B",
            part(b"image", b"x", b'; filename="a"') + part(b"top_k", b"4" * 50) + b"--B--\r\n",
            "whole number",
        ),
        ("multipart/form-data; boundary=B", part(b"other", b"x") * (MAX_PARTS + 1) + b"--B--\r\n", "more than"),
    ],
)
def test_each_broken_form_gets_its_own_reason(content_type, body, words):
    with pytest.raises(BadForm, match=words):
        read_form(content_type, body, FIELDS)


def test_unknown_and_repeated_fields_are_named():
    content_type, body = encoded(files=[("image", ("a", b"1")), ("image", ("b", b"2")), ("extra", ("c", b"3"))])
    with pytest.raises(BadForm, match="unknown field.s. extra; expected image, top_k, note"):
        read_form(content_type, body, FIELDS)
    content_type, body = encoded(files=[("image", ("a", b"1")), ("image", ("b", b"2"))])
    with pytest.raises(BadForm, match="'image' is given 2 times"):
        read_form(content_type, body, FIELDS)
