"""Errors a user can cause: each names the field or tensor and the offending value."""
from __future__ import annotations


class LensError(Exception):
    """Base of every error GGUF Lens shows to a user (CLI: one line, app: a dialog)."""


class ModelFormatError(LensError):
    """A GGUF file (or its metadata) is malformed, hostile or unsupported."""

    def __init__(self, field: str, reason: str, value: object = None, offset: int | None = None):
        self.field = field
        self.value = value
        self.reason = reason
        self.offset = offset
        where = f" at byte {offset}" if offset is not None else ""
        shown = "" if value is None else f" = {_short(value)}"
        super().__init__(f"{field}{shown}: {reason}{where}")


class InferenceError(LensError):
    """Running a model failed in a way the user should hear about (NaN, out of memory, context full)."""


class ContextFullError(InferenceError):
    """The prompt (or prompt plus reply) does not fit in the model's context."""

    def __init__(self, n_tokens: int, n_ctx: int):
        self.n_tokens = n_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"conversation is {n_tokens} tokens, the model's context is {n_ctx}; "
            "start a new chat or trim it"
        )


class SettingError(LensError):
    """A user-supplied setting (flag, sampler value, rule) is out of range or malformed."""


class FetchError(LensError):
    """A catalog model could not be fetched or failed its checksum."""


def _short(value: object, limit: int = 80) -> str:
    """repr(value) in at most `limit` characters: a long one keeps its start and its end (a path keeps its file
    name) with "…" between."""
    text = repr(value)
    if len(text) <= limit:
        return text
    tail = (limit - 1) // 2
    return text[: limit - 1 - tail] + "…" + text[-tail:]
