"""Base or instruct, and the quantization a model file says it has: what the chat needs to know about a model.

A base (pretrained) model continues text; it does not follow instructions, and wrapped in a chat template it
tends to ramble until max-tokens. The chat therefore gives a base model a short reply length and a plain-text
prompt (no chat template) by default. The catalog says which of its models are base models; any other file
is judged from the GGUF itself: a chat template in `tokenizer.chat_template`, or "instruct" / "-it" / "chat" in
its name, mark an instruction-tuned model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

BASE_NOTE = "base model: continues text, does not follow instructions"
ENCODER_DECODER_NOTE = ("encoder-decoder model: your message is its input (the encoder reads it), the reply its "
                        "output (the decoder writes it); earlier turns are not read")
ENCODER_DECODER = ("t5",)  # general.architecture values of encoder-decoder models
BASE_MAX_TOKENS = 64  # a base model's default reply length (it never stops on its own at an end of turn)
_INSTRUCT_NAME = re.compile(r"(instruct|[-_.\s]it\b|[-_.\s]it[-_.]|chat)", re.IGNORECASE)


@dataclass(frozen=True)
class ModelKind:
    """Whether a model follows instructions, why we think so, and the file's quantization (its file type)."""

    base: bool
    why: str  # "the catalog lists it as a base model", "the file has a chat template", ...
    quant: str = ""  # "Q4_K_M", "Q4_1", ... from general.file_type ("" when the file does not say)
    encoder_decoder: bool = False  # T5: the message is the encoder's input, the reply the decoder's output

    @property
    def label(self) -> str:
        return "base model" if self.base else "instruct model"


INSTRUCT = ModelKind(False, "assumed")


def file_type_name(metadata: Mapping[str, Any]) -> str:
    """The llama-quantize file type of general.file_type ("Q4_K_M", "MOSTLY_Q4_1" as "Q4_1"), "" if unknown."""
    from engine.quant.presets import FTYPE_NAMES  # noqa: PLC0415

    ftype = metadata.get("general.file_type")
    try:
        return FTYPE_NAMES.get(int(ftype), "") if ftype is not None else ""
    except (TypeError, ValueError):
        return ""


def model_kind(path: str, metadata: Mapping[str, Any], catalog_instruct: bool | None = None) -> ModelKind:
    """Base or instruct: the catalog's word when the file is a catalog model, else the GGUF's template and name."""
    quant = file_type_name(metadata)
    if metadata.get("general.architecture") in ENCODER_DECODER:  # no chat: one input, one output
        return ModelKind(True, "an encoder-decoder model reads one input and writes one output", quant, True)
    if catalog_instruct is not None:
        return ModelKind(not catalog_instruct,
                         "the catalog lists it as " + ("an instruction-tuned model" if catalog_instruct else "a base model"),
                         quant)
    if isinstance(metadata.get("tokenizer.chat_template"), str) and metadata["tokenizer.chat_template"].strip():
        return ModelKind(False, "the file has a chat template", quant)
    names = [str(metadata.get(k) or "") for k in ("general.name", "general.finetune", "general.basename")]
    names.append(str(path).replace("\\", "/").rsplit("/", 1)[-1])
    for name in names:
        if _INSTRUCT_NAME.search(name):
            return ModelKind(False, f"its name ({name[:60]}) says it is instruction-tuned", quant)
    return ModelKind(True, "the file has no chat template and its name does not say instruct/-it/chat", quant)
