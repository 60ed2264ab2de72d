"""Special tokens as llama_vocab::impl::load finds them: attribute bits, ids from metadata, ids found by text.

The tables (metadata keys per role, llama.cpp's per-model default ids, the texts it looks for to find EOT/EOM/FIM
tokens and end-of-generation tokens) and the three passes vocab.Tokenizer.from_metadata runs over them.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# token attributes, as llama_token_attr
UNDEFINED, UNKNOWN, UNUSED, NORMAL, CONTROL, USER_DEFINED, BYTE = 0, 1, 2, 4, 8, 16, 32

TOKENIZER_KEY = _K = "tokenizer.ggml."
# special-token role -> metadata key (the GGUF spec spells 'seperator')
_SPECIAL_KEYS = {
    "bos": _K + "bos_token_id", "eos": _K + "eos_token_id", "eot": _K + "eot_token_id",
    "eom": _K + "eom_token_id", "unk": _K + "unknown_token_id", "sep": _K + "seperator_token_id",
    "pad": _K + "padding_token_id", "mask": _K + "mask_token_id",
    "fim_pre": _K + "fim_pre_token_id", "fim_suf": _K + "fim_suf_token_id", "fim_mid": _K + "fim_mid_token_id",
    "fim_pad": _K + "fim_pad_token_id", "fim_rep": _K + "fim_rep_token_id", "fim_sep": _K + "fim_sep_token_id",
}
_DEPRECATED_KEYS = {"fim_pre": _K + "prefix_token_id", "fim_suf": _K + "suffix_token_id",
                    "fim_mid": _K + "middle_token_id"}
_DEFAULT_IDS = {"llama": {"bos": 1, "eos": 2, "unk": 0}, "gpt2": {"bos": 11, "eos": 11},
                "t5": {"eos": 1, "unk": 2, "pad": 0}}

# tokens llama.cpp finds by their text (llama_vocab::impl::load); finding one marks it CONTROL
_BY_TEXT = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
            "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<｜end▁of▁sentence｜>", "[e~[")
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss: USER_DEFINED


def special_ids(metadata: Mapping[str, Any], model_name: str, n: int) -> dict[str, int | None]:
    """Special token ids: per-model defaults, overridden by metadata; ids outside the vocabulary disabled."""
    ids: dict[str, int | None] = {role: None for role in _SPECIAL_KEYS}
    for role, default in _DEFAULT_IDS[model_name].items():
        ids[role] = default if default < n else None
    for role, key in list(_SPECIAL_KEYS.items()) + list(_DEPRECATED_KEYS.items()):
        if key not in metadata:
            continue
        value = metadata[key]
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= int(value) < n:
            ids[role] = int(value)
        else:
            log.warning("%s = %r is not a token id below %d; disabling %s", key, value, n, role)
            ids[role] = None
    return ids


def mark_by_text(token_to_id: Mapping[str, int], attrs: list[int], ids: dict[str, int | None]) -> None:
    """Find EOT/EOM/FIM tokens by their text and mark end-of-generation texts CONTROL, as llama.cpp does."""
    for role, candidates in _BY_TEXT.items():
        if ids[role] is not None:
            continue
        for text in candidates:
            tid = token_to_id.get(text)
            if tid is not None:
                ids[role] = tid
                attrs[tid] |= CONTROL
                break
    for text in EOG_TEXTS:
        tid = token_to_id.get(text)
        if tid is not None and not attrs[tid] & CONTROL:
            attrs[tid] |= CONTROL
    for text in _ALWAYS_RENDERED:
        tid = token_to_id.get(text)
        if tid is not None:
            attrs[tid] = USER_DEFINED


def mark_unused(texts: list[str], attrs: list[int]) -> None:
    """Mark control tokens whose text contains 'unused' UNUSED, as llama.cpp does."""
    for i, a in enumerate(attrs):
        if a & CONTROL and "unused" in texts[i]:
            attrs[i] = a | UNUSED
