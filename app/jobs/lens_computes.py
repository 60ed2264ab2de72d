"""The lens computations the LensBridge asks the engine worker for, as plain closures (no Qt): each factory takes
what the view asked (rows, a layer and head, a position) and returns compute(model, recorder, cache, token_texts),
run by app.jobs.lens.lens_job under the session lock (app.jobs.lens.in_context brings the cache to the conversation
on screen first). None: nothing recorded to compute on."""
from __future__ import annotations

from typing import Any, Callable


def recorded(recorder: Any, cache: Any, at_least: int = 1) -> bool:
    """Whether the recorder and cache hold at least `at_least` positions of some layer (attention or recurrent)."""
    return (cache is not None and recorder is not None and min(cache.length, recorder.length) >= at_least
            and bool(recorder.specs or getattr(recorder, "recurrent", None)))


def attention(max_rows: int | None, hidden: tuple[int, ...] = (0,), memo: Any = None) -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.attention import make_attention_record  # noqa: PLC0415

        if not recorded(recorder, cache):
            return None
        return make_attention_record(model, recorder, cache, texts, max_rows=max_rows, hidden_keys=hidden,
                                     reads_memo=memo)

    return compute


def roles(source: str, memo: Any = None) -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.head_roles import make_head_roles_record, make_probe_record  # noqa: PLC0415

        if source == "probe":  # its own run: stoppable, with progress, as a chat's read is (app.jobs.lens)
            from app.jobs.lens import job_cancel, job_progress  # noqa: PLC0415

            return make_probe_record(model, cancel=job_cancel(), progress=job_progress("running the induction probe"))
        if not recorded(recorder, cache, 2):
            return None
        return make_head_roles_record(model, recorder, cache, texts, reads_memo=memo)

    return compute


def state() -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.recurrent import make_state_record  # noqa: PLC0415

        if not recorded(recorder, cache):
            return None
        return make_state_record(model, recorder, cache, texts)

    return compute


def logit(position: int, width: int, memo: dict[str, Any]) -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.logit_lens import make_logit_lens_record  # noqa: PLC0415

        if cache is None or cache.length == 0:
            return None
        if memo.get("cache") is not cache:  # another chat or model: the kept streams are not this context's
            memo.clear()
            memo.update(cache=cache, streams={})
        return make_logit_lens_record(model, list(cache.tokens), position if position >= 0 else None, width=width,
                                      memo=memo["streams"])

    return compute


def head(layer: Any, head: Any, rows: Any, memo: Any = None) -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.attention import make_head_record  # noqa: PLC0415

        if not recorded(recorder, cache):
            return None
        return make_head_record(model, recorder, cache, layer, head, rows, texts, reads_memo=memo)

    return compute


def step(layer: int, head: int, query: int) -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.attention import make_step_record  # noqa: PLC0415

        if cache is None or recorder is None or min(cache.length, recorder.length) == 0 or not recorder.specs:
            return None
        return make_step_record(model, recorder, cache, texts, layer, head, query)

    return compute


def routing() -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.routing import make_routing_record  # noqa: PLC0415

        return make_routing_record(model, recorder, cache, texts)

    return compute


def tensor(name: str, block: int) -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.tensor import make_tensor_record  # noqa: PLC0415

        return make_tensor_record(model, name, block_index=block)

    return compute
