"""Text from a model, token by token: the sampling `python -m scripts.sample` runs on a run's checkpoint."""
from __future__ import annotations

import torch

from model.llama import Llama


@torch.no_grad()
def generate(model: Llama, prompt: list[int], max_new_tokens: int, context: int, temperature: float = 1.0,
             top_k: int | None = None, generator: torch.Generator | None = None,
             n_vocab: int | None = None) -> list[int]:
    """Sample token by token (no KV cache: the models here are small); the context is cropped to `context`. Only the
    first `n_vocab` ids can come out: the rest of the model's (padded) vocabulary has no token to decode."""
    model.eval()
    tokens = torch.tensor([prompt], dtype=torch.long)
    for _ in range(max_new_tokens):
        logits = model(tokens[:, -context:])[0, -1, :n_vocab].float()  # (V,)
        if temperature <= 0:
            nxt = logits.argmax()
        else:
            logits = logits / temperature
            if top_k:  # None or 0: every token
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)[0]
        tokens = torch.cat([tokens, nxt.view(1, 1)], dim=1)
    return tokens[0, len(prompt):].tolist()
