"""The one rule for class names, wherever they come from (ImageFolder's folders, a checkpoint's meta.classes,
export's --labels): each is what the service answers with, so it must name one class unambiguously and fit
in a response. Empty, whitespace-only or padded names, control characters, duplicates and names of thousands
of characters are refused with the name's index and what is wrong."""

from __future__ import annotations

from collections.abc import Sequence

MAX_NAME_LENGTH = 200


def check_class_names(names: Sequence[object], where: str) -> list[str]:
    """`names` as strings, or ValueError naming `where` the bad one came from."""
    seen: dict[str, int] = {}
    checked = []
    for index, name in enumerate(names):
        text = str(name)
        problem = None
        if not text.strip():
            problem = "is empty or only whitespace"
        elif text != text.strip():
            problem = "starts or ends with whitespace"
        elif not text.isprintable():
            problem = "holds control characters"
        elif len(text) > MAX_NAME_LENGTH:
            problem = f"is {len(text)} characters long (at most {MAX_NAME_LENGTH})"
        elif text in seen:
            problem = f"repeats class {seen[text]}"
        if problem:
            raise ValueError(f"{where}: class {index} ({text[:40]!r}) {problem}; each class needs a distinct name")
        seen[text] = index
        checked.append(text)
    return checked
