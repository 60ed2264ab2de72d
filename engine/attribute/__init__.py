"""Why this token: attribution of a reply token's logit (or logit difference) to the embedding, each head, each
FFN or expert and each input token, computed on the model as it runs."""
