"""The JSON parser of every face: DRF's, plus a 400 for inputs that became 500s: nesting
deep enough for RecursionError, and lone UTF-16 surrogates ("\\ud800") that neither the
renderer nor PostgreSQL can encode, in any key or value."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 32  # our bodies are flat; anything deeper is not ours


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON parse error - nested too deeply") from exc
        _check(data, depth=0)
        return data


def _check(value: Any, *, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ParseError("JSON parse error - nested too deeply")
    if isinstance(value, str):
        _check_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check(item, depth=depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check(item, depth=depth + 1)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ParseError("JSON parse error - a string holds an unpaired surrogate") from exc
