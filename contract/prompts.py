"""A sentence encoder's prompts, as sentence-transformers applies them: a named prompt is a text put before the
user's text ("query: " + text), the default prompt applies when a request names none, and "" is no prompt.

The export reads them from `config_sentence_transformers.json` (export/readers/sentence_transformers.py) into the
manifest's `embedding.prompts`; the service applies them (serve/tasks/text_embedding.py), so a text is embedded as
`SentenceTransformer.encode(text)` embeds it, and `prompt_name` picks another, as text-embeddings-inference's does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contract.errors import ClientError

MAX_PROMPT_CHARS = 1000  # a prompt is an instruction, not a document


@dataclass(frozen=True)
class Prompts:
    named: dict[str, str] = field(default_factory=dict)
    default: str | None = None  # a key of `named`

    @classmethod
    def read(cls, config: dict[str, Any], where: str) -> Prompts:
        """The `prompts` and `default_prompt_name` of a config (sentence-transformers' or the manifest's);
        ValueError naming `where` for ones that are not texts by name, or a default that is not one of them."""
        named = config.get("prompts") or {}
        default = config.get("default_prompt_name")
        texts = isinstance(named, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in named.items())
        if not texts or any(len(v) > MAX_PROMPT_CHARS for v in named.values()):
            raise ValueError(f"{where}: prompts must map names to texts of at most {MAX_PROMPT_CHARS} characters")
        if default is not None and default not in named:
            raise ValueError(f"{where}: default_prompt_name {default!r} is not one of the prompts")
        return cls(dict(named), default)

    def prefix(self, name: str | None) -> str:
        """The text put before each text of a request naming prompt `name` (None: the default prompt's)."""
        if name is None:
            return self.named[self.default] if self.default is not None else ""
        if name not in self.named:
            known = ", ".join(sorted(self.named)) or "none"
            raise ClientError(f"prompt_name {name[:100]!r} is not one of this model's prompts ({known})")
        return self.named[name]

    def to_manifest(self) -> dict[str, Any]:
        return {"prompts": self.named, "default_prompt_name": self.default}
