"""A multipart/form-data body, already read whole by the front door, split into its parts and checked against
its route's fields.

The parts are found with `bytes.find` on the delimiter (C speed, linear in the body whatever it holds), each
part's bytes sliced out of the body in memory. python-multipart's parser, used before, walks the padding after
a delimiter (and bytes that begin like one) one byte at a time in Python: 4 MB of padding held the event loop
1.35 s, a 19 MB body 8 s (security round 3). Here a delimiter may be followed by at most MAX_PADDING spaces or
tabs (RFC 2046's transport padding, which no client sends), a part's headers are at most MAX_PART_HEADER_BYTES,
and a body that ends before its closing delimiter is refused, not read as far as it goes.
"""

from __future__ import annotations

from dataclasses import dataclass

from python_multipart.multipart import parse_options_header

from contract.errors import ClientError

MAX_DIGITS = 6
# A route's forms have a few fields; a body of thousands of tiny parts is refused instead of parsed to the end.
MAX_PARTS = 32
MAX_PADDING = 64
MAX_PART_HEADER_BYTES = 8192
MAX_BOUNDARY = 70  # RFC 2046 5.1.1
CRLF = b"\r\n"


def small_integer(value: object) -> bool:
    """A short decimal integer in ASCII digits. Python refuses to parse integers of thousands of digits, and
    str.isdigit() also admits '²' and '①', which int() then refuses: both would escape as a ValueError."""
    text = value.strip() if isinstance(value, str) else ""
    digits = text[1:] if text[:1] in ("+", "-") else text
    return digits.isascii() and digits.isdigit() and len(text) <= MAX_DIGITS


@dataclass
class _Part:
    name: str
    is_file: bool
    data: bytes


def _part(headers: bytes, data: bytes) -> _Part:
    """One part from its header block (lines of `Name: value`) and its bytes."""
    disposition = None
    for line in headers.split(CRLF) if headers else []:
        name, colon, value = line.partition(b":")
        if not colon or not name.strip():
            raise ClientError("malformed multipart body (a part's header line has no name and colon)")
        if name.strip().lower() == b"content-disposition":
            if disposition is not None:  # two readers could take different ones: refuse the ambiguity
                raise ClientError("a part has two Content-Disposition headers")
            disposition = value.strip()
    _, options = parse_options_header(disposition or b"")
    field_name = options.get(b"name")
    if field_name is None:
        raise ClientError('a part has no Content-Disposition header with a "name"')
    # A filename (RFC 7578), or only an RFC 2231 `filename*` (older urllib3, for non-ASCII names), which
    # parse_options_header leaves out of `options`.
    is_file = b"filename" in options or b"filename*=" in (disposition or b"").lower()
    return _Part(field_name.decode("utf-8", "replace"), is_file, data)


def _after_padding(body: bytes, at: int) -> int:
    """Where a part's headers start: past a delimiter's transport padding (spaces, tabs) and its line break."""
    end, limit = at, min(len(body), at + MAX_PADDING + 1)
    while end < limit and body[end] in b" \t":
        end += 1
    if end + 2 > len(body):
        raise ClientError("malformed multipart body (it ends before its closing boundary: truncated?)")
    if body[end : end + 2] != CRLF:
        raise ClientError(
            f"malformed multipart body (a boundary must be followed by a line break, after at most {MAX_PADDING} "
            "spaces)"
        )
    return end + 2


def _parts(content_type: str, body: bytes) -> list[_Part]:
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary or len(boundary) > MAX_BOUNDARY:
        raise ClientError(
            f"malformed multipart body (no boundary of 1 to {MAX_BOUNDARY} characters in its Content-Type)"
        )
    if not body:
        return []
    dash_boundary, delimiter = b"--" + boundary, CRLF + b"--" + boundary
    if body.startswith(dash_boundary):
        at = len(dash_boundary)
    else:  # a preamble before the first delimiter, which RFC 2046 allows and readers ignore
        found = body.find(delimiter)
        if found < 0:
            raise ClientError("malformed multipart body (its boundary never appears)")
        at = found + len(delimiter)
    parts: list[_Part] = []
    while not body.startswith(b"--", at):  # "--" after a delimiter closes the body; the epilogue is ignored
        if len(parts) == MAX_PARTS:
            raise ClientError(f"the form has more than {MAX_PARTS} parts")
        start = _after_padding(body, at)
        # An empty header block is the line break just read followed by another.
        headers_end = body.find(CRLF + CRLF, start - 2, start + MAX_PART_HEADER_BYTES)
        if headers_end < 0:
            raise ClientError(
                f"malformed multipart body (a part's headers do not end within {MAX_PART_HEADER_BYTES} bytes)"
            )
        data_start = headers_end + 4
        data_end = body.find(delimiter, data_start)
        if data_end < 0:
            raise ClientError("malformed multipart body (it ends before its closing boundary: truncated?)")
        parts.append(_part(body[start:headers_end] if headers_end > start else b"", body[data_start:data_end]))
        at = data_end + len(delimiter)
    return parts


def read_form(content_type: str, body: bytes, fields: dict[str, str]) -> tuple[bytes, dict[str, list[str]]]:
    """A multipart body checked against its route's fields ({name: "file" | "integer" | "text"}: unknown,
    missing, repeated, a text where a file belongs): the file field's bytes and the other fields' values.
    Raises ClientError."""
    parts = _parts(content_type, body)
    unknown = sorted({part.name for part in parts} - set(fields))
    if unknown:
        raise ClientError(f"unknown field(s) {', '.join(unknown)}; expected {', '.join(fields)}")
    file, params = b"", {}
    for name, kind in fields.items():
        given = [part for part in parts if part.name == name]
        if len(given) > 1:  # two readers could pick different ones: refuse the ambiguity
            raise ClientError(f"field '{name}' is given {len(given)} times; send it once")
        if not given:
            if kind == "file":
                raise ClientError(f"missing file field '{name}'")
            continue
        part, data = given[0], given[0].data
        if kind == "file":
            if not part.is_file:
                raise ClientError(f"field '{name}' must be a file upload")
            file = data
            continue
        if part.is_file:
            raise ClientError(f"field '{name}' must be a plain form field, not a file")
        try:
            value = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ClientError(f"field '{name}' is not UTF-8 text") from None
        if kind == "integer" and not small_integer(value):
            raise ClientError(f"field '{name}' must be a whole number of at most {MAX_DIGITS} digits")
        params[name] = [value]
    return file, params
