"""The Attention lens: the layers x heads grid, one head up close, the token text, and one cell step by step with
its sqrt(d_k) panel; `lens` puts them together. May import records, views.common and each other (lens on top)."""
