"""Why this token: attribution of a reply token's logit (or logit difference) to the embedding, each head, each FFN or
expert, computed on the model as it runs.

- `api`: `attribute(model, prompt, target, contrast=None, position=None)` -> `Attribution` (named arrays, `to_json()`);
- `direct`: direct logit attribution, exact (the parts sum to the engine's own logit, remainders labelled);
- `parts`: what each head, FFN and expert of one block writes to the residual stream at a position;
- `capture`: the one forward pass whose activations the decomposition reads;
- `tokens`: TOKEN as text or `#id`, the prompt, the position, with errors a user can act on.

- `inputs`: input x gradient and integrated gradients per prompt token (engine.grad's backward), with IG's completeness
  error;
- `attribution_patching`: the gradient estimate of every head's and position's patching effect, checked against real
  activation patching (Spearman, top-10 overlap).
"""
