"""Tokenizers built from GGUF metadata, id for id with llama.cpp.

`vocab` holds the Tokenizer (special tokens, BOS/EOS rules, the streaming detokenizer), `bpe` the gpt2-style
byte-level BPE with every pre-tokenizer llama.cpp names, `spm` SentencePiece (Gemma). Imports only
`engine.errors` and the standard library: no model, no numpy arrays of weights.
"""
