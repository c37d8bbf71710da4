"""`Route`: which provider pool a unit calls — the model, the upstream, and the key when known.

A route is a plain value (a NamedTuple, so it hashes and pickles cheaply). The
provider admission keys its bulkheads by it, and the route it chose is what the
handler calls. It lives here, below fleet, so that `admission` stands alone;
users write it as `fleet.Route`, the same class. This module imports nothing.
"""
from __future__ import annotations

from typing import NamedTuple


class Route(NamedTuple):
    """A provider pool: `model` served by `provider`, with `credential` (a key's name) when known.

    Two units on the same route share one bulkhead. ``credential=None`` means the key
    is not known, so a refusal that closes a key closes every pool of the provider.
    """

    model: str
    provider: str
    credential: str | None = None

    def __str__(self) -> str:
        text = f"{self.model}@{self.provider}"
        return text if self.credential is None else f"{text}/{self.credential}"

    @classmethod
    def parse(cls, text: str) -> "Route":
        """``"model@provider"`` or ``"model@provider/credential"`` -> Route; ValueError if malformed."""
        if not isinstance(text, str) or "@" not in text:
            raise ValueError(f"route {text!r}: expected 'model@provider' or 'model@provider/credential'")
        model, _, rest = text.rpartition("@")
        provider, _, credential = rest.partition("/")
        if not model or not provider or ("/" in rest and not credential):
            raise ValueError(f"route {text!r}: expected 'model@provider' or 'model@provider/credential'")
        return cls(model, provider, credential or None)
