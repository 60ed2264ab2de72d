"""attribute()'s inputs and outputs: tokens by text or #id, positions, refusals that change nothing, the JSON object
and the `gguf-lens attribute` command; one run on the real SmolLM2."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.attribute.api import attribute
from engine.attribute.tokens import resolve_token
from engine.cli.main import main
from engine.errors import LensError, SettingError
from engine.generate import prefill
from engine.model import load_model
from tests.engine.arch_files import arch_file
from tests.tiny_models import make_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("attr") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny_model(tiny: Path):  # noqa: ANN201
    m = load_model(tiny, numerics="float32", warm=False)
    yield m
    m.close()


def test_tokens_by_text_or_id_and_refusals(tiny_model) -> None:  # noqa: ANN001
    tok = tiny_model.tokenizer
    the = resolve_token(tok, " the")
    assert tok.encode(" the") == [the.id] and resolve_token(tok, f"#{the.id}") == the == resolve_token(tok, the.id)
    assert resolve_token(tok, "Ġthe") == the  # the vocabulary's own string
    with pytest.raises(SettingError, match="not one token of the vocabulary: it tokenizes to 3 tokens"):
        resolve_token(tok, "xyz")
    with pytest.raises(SettingError, match=r"#100000: not in the vocabulary \(ids 0\.\.268\)"):
        resolve_token(tok, "#100000")
    with pytest.raises(SettingError, match="must be followed by a token id"):
        resolve_token(tok, "#abc")


def test_bad_input_is_refused_and_changes_nothing(tiny_model) -> None:  # noqa: ANN001
    net = tiny_model.net
    before = attribute(tiny_model, "the cat sat", "#40")
    cases = [({"target": "xyz"}, "not one token"), ({"target": "#5000"}, "not in the vocabulary"),
             ({"position": 9}, r"position 9 is past the prompt's 9 tokens"), ({"position": -10}, "past the prompt"),
             ({"contrast": "#40"}, "the contrast is the target"), ({"method": "patching"}, "needs --corrupt"),
             ({"method": "ixg", "corrupt": "the cat sat"}, "give --method patching"), ({"method": "lrp"}, "not one of"),
             ({"method": "patching", "corrupt": "the"}, "needs prompts of the same length")]
    for extra, message in cases:
        kw = {"target": "#40", **extra}
        with pytest.raises(LensError, match=message):
            attribute(tiny_model, "the cat sat", **kw)
    with pytest.raises(SettingError, match="no tokens"):
        attribute(tiny_model, [], "#40")
    assert net.hooks == {} and not net.ablated_blocks
    again = attribute(tiny_model, "the cat sat", "#40")
    np.testing.assert_array_equal(again.values, before.values)


def test_encoder_decoder_is_attributed_with_its_decoders_tokens(t5_q8_path: Path, tiny_model) -> None:  # noqa: ANN001
    model = load_model(t5_q8_path, numerics="float32", warm=False)
    try:
        net = model.net
        a = attribute(model, "hello there", "#5", contrast="#9", decoder=[11, 8])
        out = a.to_json()
        assert out["decoder_tokens"] == [net.decoder_start_token, 11, 8] and out["position"] == 2
        assert abs(sum(c["value"] for c in out["components"]) - out["logit_diff"]) < 1e-9
        assert {c["kind"] for c in out["components"]} >= {"embed", "head", "cross_head", "ffn"}
        first = attribute(model, "hello there", "#5", decoder=[11, 8], position=0)  # after the start token alone
        assert first.to_json()["decoder_tokens"] == out["decoder_tokens"] and first.position == 0
        with pytest.raises(SettingError, match="attribution patching is not available for t5"):
            attribute(model, "hello there", "#5", method="patching", corrupt="hello where")
        with pytest.raises(SettingError, match="position 3 is past"):
            attribute(model, "hello there", "#5", decoder=[11, 8], position=3)
    finally:
        model.close()
    with pytest.raises(SettingError, match="--decoder is the decoder's text of an encoder-decoder model"):
        attribute(tiny_model, "the cat sat", "#40", decoder="x")


def test_json_object_and_named_arrays(tiny_model) -> None:  # noqa: ANN001
    a = attribute(tiny_model, "the cat sat on", " the", " a", position=-2)
    out = a.to_json()
    assert out["position"] == len(a.tokens) - 2 and out["target"]["text"] == " the" and out["contrast"]["text"] == " a"
    comps = out["components"]
    assert comps[0] == {"kind": "embed", "layer": None, "index": None, "value": pytest.approx(a.values[0])}
    assert abs(sum(c["value"] for c in comps) - out["logit_diff"]) < 1e-9
    kinds = {c["kind"] for c in comps}
    assert kinds == {"embed", "head", "ffn", "remainder"}
    heads = [(c["layer"], c["index"]) for c in comps if c["kind"] == "head"]
    assert heads == [(i, h) for i in range(2) for h in range(4)]
    assert comps[-1]["kind"] == "remainder" and comps[-1]["layer"] is None
    assert a.top(3)[0][3] == max(a.values[a.kinds != "remainder"], key=abs)
    json.dumps(out)


def test_cli_prints_one_json_object_and_refuses_in_one_line(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attribute", str(tiny), "--prompt", "the cat sat", "--target", " the", "--contrast", "#40",
                 "--numerics", "float32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"target", "contrast", "position", "logit_diff", "components"}
    assert abs(sum(c["value"] for c in out["components"]) - out["logit_diff"]) < 1e-4
    model = load_model(tiny, numerics="float32", warm=False)
    try:
        ids = model.tokenizer.encode("the cat sat", add_special=True, parse_special=False)
        row = prefill(model, ids, model.new_cache(len(ids)), all_logits=True)[-1].astype(np.float64)
        assert abs(out["logit_diff"] - (row[out["target"]["id"]] - row[40])) < 1e-4
    finally:
        model.close()
    assert main(["attribute", str(tiny), "--prompt", "the cat", "--target", "#40", "--position", "9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "position 9 is past the prompt's" in err
    assert main(["attribute", str(tiny), "--prompt", "the cat", "--target", "#40", "--method", "patching"]) == 2
    assert "needs --corrupt" in capsys.readouterr().err
    assert main(["attribute", str(tiny), "--prompt", "the cat", "--target", "#40", "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("logit ") and text.count("\n") == 5


@pytest.mark.parametrize("numerics", ["float32", "ggml"])
def test_smollm2_parts_sum_to_its_logit_difference(smollm2_path: Path, numerics: str) -> None:
    model = load_model(smollm2_path, numerics=numerics)
    try:
        prompt = "The Eiffel Tower is in the city of"
        a = attribute(model, prompt, " Paris", " London")
        ids = list(a.tokens)
        row = prefill(model, ids, model.new_cache(len(ids)), all_logits=True)[-1].astype(np.float64)
        assert abs(a.logit_diff - (row[a.target.id] - row[a.contrast.id])) < 1e-4
        assert abs(float(a.values.sum()) - a.logit_diff) < 1e-9
        assert a.logit_diff > 0  # the model knows
        rest = abs(a.remainder()) / np.abs(a.values).max()
        assert rest < (1e-4 if numerics == "float32" else 0.2), rest
    finally:
        model.close()


def test_gemma3_runs_through_the_cli(arch_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = arch_file(arch_dir, "gemma3")
    assert main(["attribute", str(path), "--prompt", "the cat", "--target", "#40", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(sum(c["value"] for c in out["components"]) - out["logit_diff"]) < 1e-9


def test_t5_runs_through_the_cli_with_its_decoder_text(t5_q8_path: Path, tiny: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attribute", str(t5_q8_path), "--prompt", "hello there", "--decoder", "hi", "--target", "#5",
                 "--method", "ixg", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(sum(c["value"] for c in out["components"]) - out["logit_diff"]) < 1e-9
    n_dec = len(out["decoder_tokens"])
    assert n_dec >= 2 and out["position"] == n_dec - 1  # the start token, then the text's tokens
    assert len(out["inputs"]["tokens"]) == out["n_tokens"] + n_dec  # the encoder's tokens, then the decoder's
    assert main(["attribute", str(t5_q8_path), "--prompt", "hello", "--decoder", "hi", "--target", "#5"]) == 0
    assert "at decoder position" in capsys.readouterr().out
    assert main(["attribute", str(tiny), "--prompt", "the cat", "--decoder", "x", "--target", "#40"]) == 2
    assert "--decoder is the decoder's text" in capsys.readouterr().err
