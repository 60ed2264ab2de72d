"""Chat templates: the model's Jinja template rendered in a sandbox, and the built-in fallbacks.

`template` turns a conversation into the prompt text as transformers' apply_chat_template does (ChatTemplate),
`template_globals` is what a template finds in its environment (transformers' globals, the generation tag),
`sandbox` is the locked-down Jinja environment with its time, size and depth caps, and `builtin` holds the
ChatML and Gemma templates used when a model's own fails. May import `engine.tokenizer` and `engine.errors` only.
"""
