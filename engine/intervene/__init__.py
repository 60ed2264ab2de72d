"""Interventions on a loaded model's forward pass, the "what if" side of the lenses.

`ablation`: switch attention heads off (their output zeroed before the attention output product, which is what a
copy of the file with that head's `attn_output` columns set to zero computes). What is ablated stays on the model
until it is cleared, and `describe` names it for a reply's signature.
"""
