"""OpenAI's reply objects built from the runner's events: whole replies and server-sent-event chunks.

Chat replies are `chat.completion` / `chat.completion.chunk` objects with log-probabilities as
choices[0].logprobs.content[i] = {token, logprob, bytes, top_logprobs}; /v1/completions replies are
`text_completion` objects with the legacy log-probability lists (tokens, token_logprobs, top_logprobs,
text_offset). A stream is `data: {json}` events, the first chunk naming the assistant role, the last carrying
finish_reason, then (with stream_options.include_usage) one chunk of usage with no choices, then `data: [DONE]`.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

from engine.serve.protocol import ApiError, GenRequest
from engine.serve.runner import Finished, Piece, TokenLogprob

DONE = "data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> str:
    """One server-sent event carrying a JSON object."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def usage(done: Finished) -> dict[str, int]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def _chat_logprob(t: TokenLogprob) -> dict[str, Any]:
    return {"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes),
            "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(b)} for s, lp, b in t.top]}


class ReplyFormat:
    """Turns one request's events into OpenAI objects; `Chat` and `Completion` fill in the shapes."""

    object_name = ""
    chunk_name = ""
    id_prefix = ""

    def __init__(self, request: GenRequest, model_id: str):
        self.request = request
        self.model_id = model_id
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def _envelope(self, name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": name, "created": self.created, "model": self.model_id,
                "system_fingerprint": "gguf-lens", "choices": choices}

    # --- the whole reply ------------------------------------------------------------------------------------------

    def whole(self, pieces: list[Piece], done: Finished) -> dict[str, Any]:
        """The reply object of a request that did not stream."""
        text = "".join(p.text for p in pieces)
        tokens = [p.logprob for p in pieces if p.logprob is not None]
        out = self._envelope(self.object_name, [self._choice(text, tokens, done.finish_reason)])
        out["usage"] = usage(done)
        return out

    def _choice(self, text: str, tokens: list[TokenLogprob], finish_reason: str) -> dict[str, Any]:
        raise NotImplementedError

    # --- a stream -------------------------------------------------------------------------------------------------

    def opening(self) -> list[str]:
        """Events sent before the first token."""
        return []

    def chunk(self, piece: Piece) -> str:
        raise NotImplementedError

    def closing(self, done: Finished) -> list[str]:
        """The finishing chunk, the usage chunk when asked for, and [DONE]."""
        events = [sse(self._finish_chunk(done.finish_reason))]
        if self.request.include_usage:
            events.append(sse({**self._envelope(self.chunk_name, []), "usage": usage(done)}))
        return [*events, DONE]

    def _finish_chunk(self, finish_reason: str) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def error(err: ApiError) -> list[str]:
        """An error after the stream began (its status is already sent): the error object as an event, then [DONE]."""
        return [sse(err.body()), DONE]


class Chat(ReplyFormat):
    object_name = "chat.completion"
    chunk_name = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def _choice(self, text: str, tokens: list[TokenLogprob], finish_reason: str) -> dict[str, Any]:
        logprobs = {"content": [_chat_logprob(t) for t in tokens], "refusal": None} if self.request.logprobs else None
        return {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": logprobs, "finish_reason": finish_reason}

    def opening(self) -> list[str]:
        return [sse(self._envelope(self.chunk_name, [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]))]

    def chunk(self, piece: Piece) -> str:
        logprobs = {"content": [_chat_logprob(piece.logprob)], "refusal": None} if piece.logprob is not None else None
        return sse(self._envelope(self.chunk_name, [
            {"index": 0, "delta": {"content": piece.text}, "logprobs": logprobs, "finish_reason": None}]))

    def _finish_chunk(self, finish_reason: str) -> dict[str, Any]:
        return self._envelope(self.chunk_name, [{"index": 0, "delta": {}, "logprobs": None,
                                                 "finish_reason": finish_reason}])


class Completion(ReplyFormat):
    object_name = "text_completion"
    chunk_name = "text_completion"
    id_prefix = "cmpl"

    def __init__(self, request: GenRequest, model_id: str):
        super().__init__(request, model_id)
        self._offset = 0  # characters of the reply streamed so far (text_offset of the next token)

    def _legacy(self, tokens: list[TokenLogprob], start: int) -> dict[str, Any]:
        """OpenAI's legacy lists; text_offset counts characters of the reply from `start`."""
        offsets, at = [], start
        for t in tokens:
            offsets.append(at)
            at += len(t.token)
        return {"tokens": [t.token for t in tokens], "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [{s: lp for s, lp, _ in t.top} for t in tokens] if self.request.top_logprobs else None,
                "text_offset": offsets}

    def _choice(self, text: str, tokens: list[TokenLogprob], finish_reason: str | None) -> dict[str, Any]:
        logprobs = self._legacy(tokens, 0) if self.request.logprobs else None
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def chunk(self, piece: Piece) -> str:
        logprobs = self._legacy([piece.logprob], self._offset) if piece.logprob is not None else None
        self._offset += len(piece.text)
        return sse(self._envelope(self.chunk_name, [
            {"index": 0, "text": piece.text, "logprobs": logprobs, "finish_reason": None}]))

    def _finish_chunk(self, finish_reason: str) -> dict[str, Any]:
        return self._envelope(self.chunk_name, [{"index": 0, "text": "", "logprobs": None,
                                                 "finish_reason": finish_reason}])


def reply_format(request: GenRequest, model_id: str) -> ReplyFormat:
    """The format for a request's route."""
    return (Chat if request.kind == "chat" else Completion)(request, model_id)
