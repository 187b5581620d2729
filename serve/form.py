"""A multipart/form-data body, already read whole by the front door, parsed and checked against its route's fields.

python-multipart's parser finds the parts (with its own bounds on each part's headers), and each part's bytes
are sliced out of the body in memory. Starlette's form reader, used before, spooled every file over 1 MB to a
temporary file on disk and read it back through a thread: 3.2 x the event loop's time per form for 12-megapixel
photos, 1.9 x for 400 x 300 views (`bench/form_parse.py`), and disk writes under load that nobody asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart.multipart import MultipartParser, parse_options_header

MAX_DIGITS = 6
# A route's forms have a few fields; a body of thousands of tiny parts is refused instead of parsed to the end.
MAX_PARTS = 32


class BadForm(ValueError):
    """What is wrong with a multipart body, in words the client can act on (answered with 400)."""


def small_integer(value: object) -> bool:
    """A short decimal integer in ASCII digits. Python refuses to parse integers of thousands of digits, and
    str.isdigit() also admits '²' and '①', which int() then refuses: both would escape as a ValueError."""
    text = value.strip() if isinstance(value, str) else ""
    digits = text[1:] if text[:1] in ("+", "-") else text
    return digits.isascii() and digits.isdigit() and len(text) <= MAX_DIGITS


@dataclass
class _Part:
    name: str = ""
    is_file: bool = False
    chunks: list[bytes] = field(default_factory=list)


class _Parts:
    """python-multipart's callbacks: the parts in order, each with its name, whether it is a file, its bytes."""

    def __init__(self) -> None:
        self.parts: list[_Part] = []
        self._header_name = b""
        self._header_value = b""
        self._disposition = b""

    def on_part_begin(self) -> None:
        if len(self.parts) == MAX_PARTS:
            raise BadForm(f"the form has more than {MAX_PARTS} parts")
        self.parts.append(_Part())
        self._disposition = b""

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name = self._header_value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        name = options.get(b"name")
        if name is None:
            raise BadForm('a part has no Content-Disposition header with a "name"')
        self.parts[-1].name = name.decode("utf-8", "replace")
        # A filename (RFC 7578), or only an RFC 2231 `filename*` (older urllib3, for non-ASCII names), which
        # python-multipart's header parser leaves out of `options`.
        self.parts[-1].is_file = b"filename" in options or b"filename*=" in self._disposition.lower()

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        self.parts[-1].chunks.append(data[start:end])  # the body arrives in one piece: usually one slice


def _parts(content_type: str, body: bytes) -> list[_Part]:
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise BadForm("malformed multipart body (no boundary in its Content-Type)")
    found = _Parts()
    callbacks = {
        "on_part_begin": found.on_part_begin,
        "on_header_field": found.on_header_field,
        "on_header_value": found.on_header_value,
        "on_header_end": found.on_header_end,
        "on_headers_finished": found.on_headers_finished,
        "on_part_data": found.on_part_data,
    }
    try:
        parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
        parser.write(body)
        parser.finalize()
    except BadForm:
        raise
    except Exception as err:  # noqa: BLE001 - any parse failure is the client's malformed body
        raise BadForm(f"malformed multipart body ({err})") from None
    return found.parts


def read_form(content_type: str, body: bytes, fields: dict[str, str]) -> tuple[bytes, dict[str, list[str]]]:
    """A multipart body checked against its route's fields ({name: "file" | "integer" | "text"}: unknown,
    missing, repeated, a text where a file belongs): the file field's bytes and the other fields' values.
    Raises BadForm."""
    parts = _parts(content_type, body)
    unknown = sorted({part.name for part in parts} - set(fields))
    if unknown:
        raise BadForm(f"unknown field(s) {', '.join(unknown)}; expected {', '.join(fields)}")
    file, params = b"", {}
    for name, kind in fields.items():
        given = [part for part in parts if part.name == name]
        if len(given) > 1:  # two readers could pick different ones: refuse the ambiguity
            raise BadForm(f"field '{name}' is given {len(given)} times; send it once")
        if not given:
            if kind == "file":
                raise BadForm(f"missing file field '{name}'")
            continue
        part, data = given[0], b"".join(given[0].chunks)
        if kind == "file":
            if not part.is_file:
                raise BadForm(f"field '{name}' must be a file upload")
            file = data
            continue
        if part.is_file:
            raise BadForm(f"field '{name}' must be a plain form field, not a file")
        try:
            value = data.decode("utf-8")
        except UnicodeDecodeError:
            raise BadForm(f"field '{name}' is not UTF-8 text") from None
        if kind == "integer" and not small_integer(value):
            raise BadForm(f"field '{name}' must be a whole number of at most {MAX_DIGITS} digits")
        params[name] = [value]
    return file, params
