"""Chat templates: the model's Jinja template rendered in a sandbox, and the built-in fallbacks.

`template` turns a conversation into the prompt text (ChatTemplate), `sandbox` is the locked-down Jinja
environment with its time, size and depth caps. May import `engine.tokenizer` and `engine.errors` only.
"""
