"""The Why lens's job on an encoder-decoder chat (T5): the conversation read as the encoder's input (the last user
message), the decoder's start token and the reply; a reply token explained by the engine's encoder-decoder
attribution (self- and cross-attention heads), an encoder token refused with a message."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.jobs.attribution import AttributionMemo, attribution, conversation_ids
from app.records.attribution import REPLY_TOKEN
from app.records.reply import GenerationRequest
from engine.attribute.api import attribute
from engine.errors import SettingError
from engine.model import load_model
from tests.engine.arch_files import arch_file

REPLY = (11, 8, 23)


@pytest.fixture(scope="module")
def t5(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    model = load_model(arch_file(tmp_path_factory.mktemp("why_t5"), "t5"), warm=False)
    yield model
    model.close()


def _context(model) -> GenerationRequest:  # noqa: ANN001
    text = "".join(model.tokenizer.token_text(t) for t in REPLY)
    return GenerationRequest(messages=(("user", "the cat sat on the mat"), ("assistant", text)), continue_ids=REPLY,
                             continue_text=text)


def test_a_reply_token_of_a_t5_chat_is_explained_by_the_encoder_decoder_attribution(t5) -> None:  # noqa: ANN001
    ctx = _context(t5)
    ids, reply_start = conversation_ids(t5, None, ctx)
    enc = t5.tokenizer.encode("the cat sat on the mat", add_special=True, parse_special=False)
    assert ids == [*enc, t5.net.decoder_start_token, *REPLY] and reply_start == len(enc) + 1
    rec = attribution(ctx, REPLY_TOKEN + 1, "", AttributionMemo())(t5, None, None, []).record
    assert rec.token_index == reply_start + 1 and rec.target_id == REPLY[1]
    want = attribute(t5, enc, f"#{REPLY[1]}", decoder=list(REPLY[:1]))  # the engine's, directly
    np.testing.assert_array_equal(rec.values, want.values)
    assert abs(float(np.sum(rec.values)) - rec.logit_diff) < 1e-9 * max(1.0, abs(rec.logit_diff))
    assert "cross_head" in set(rec.kinds) and rec.heads.shape == (len(t5.net.dec_layers), t5.net.args.n_heads)
    with pytest.raises(SettingError, match="the encoder's input, which the model reads and does not write"):
        attribution(ctx, 2, "", AttributionMemo())(t5, None, None, [])


def test_input_tint_covers_the_encoder_and_the_decoder_tokens_before_it(t5) -> None:  # noqa: ANN001
    ctx = _context(t5)
    ids, reply_start = conversation_ids(t5, None, ctx)
    rec = attribution(ctx, REPLY_TOKEN + 2, "", AttributionMemo(), method="ixg")(t5, None, None, []).record
    assert rec.inputs is not None and len(rec.inputs) == reply_start + 2  # every token before the explained one
    assert np.all(np.isfinite(rec.inputs)) and np.abs(rec.inputs[: reply_start - 1]).max() > 0  # the encoder's too
