"""The page at GET / (serve/http/static/index.html) and the headers it is sent with.

Its Content-Security-Policy allows the page's own inline script and style, by hash, and nothing else: no
other script, no framing, no content sniffing; it may only talk to this service.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

PAGE = Path(__file__).with_name("static") / "index.html"


def _inline_hash(page: str, tag: str) -> str:
    match = re.search(rf"<{tag}>(.*?)</{tag}>", page, re.S)
    if match is None:
        raise ValueError(f"{PAGE.name}: no <{tag}> block to hash")
    return "'sha256-" + base64.b64encode(hashlib.sha256(match.group(1).encode()).digest()).decode() + "'"


def page_headers(page: str) -> dict[str, str]:
    policy = (
        f"default-src 'none'; script-src {_inline_hash(page, 'script')}; style-src {_inline_hash(page, 'style')}; "
        "img-src blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return {
        "content-security-policy": policy,
        "x-content-type-options": "nosniff",
        "x-frame-options": "DENY",
        "referrer-policy": "no-referrer",
    }


PAGE_HEADERS = page_headers(PAGE.read_text())
