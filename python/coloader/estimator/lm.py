"""Two GPT-2-like decoder language models, plain torch, for the memory estimator and its
ground truth (`lm:gpt2-small`, `lm:gpt2-medium`).

The shapes follow GPT-2's published sizes (Radford et al. 2019: 12 layers of width 768, and
24 of width 1024; vocabulary 50257); the code is ours. Attention is written out (scores,
causal mask, softmax, weighted sum) rather than calling scaled_dot_product_attention, so the
same operations run on every torch version we meet (1.13 on the development machines, 2.11 on
the GPU machines) and the memory the estimator traces is the memory the GPU run spends. There
is no dropout: it would only add a mask per layer and nothing to what we measure.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

CONFIGS = {
    # name: (layers, width, heads); vocabulary and context length are shared.
    "gpt2-small": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
}
VOCAB = 50257
MAX_SEQ = 1024


class _Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x, mask):
        b, s, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(w, dim=2)
        q, k, v = (t.view(b, s, self.heads, w // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(w // self.heads))
        scores = scores.masked_fill(mask[:s, :s], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, w))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Token ids [B, S] (int64) in, logits [B, S, VOCAB] out; the output head shares the
    token embedding's weights, as GPT-2's does."""

    def __init__(self, layers, width, heads, vocab=VOCAB, max_seq=MAX_SEQ):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(max_seq, width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight
        # True above the diagonal: the positions a token may not see.
        self.register_buffer("mask", torch.ones(max_seq, max_seq, dtype=torch.bool).triu(1), persistent=False)
        self.max_seq = max_seq

    def _apply(self, fn, *args, **kwargs):
        # Moving between devices of different tensor types (to the meta device, say) makes new
        # Parameters; tie the head to the embedding again so it stays one tensor.
        super()._apply(fn, *args, **kwargs)
        self.head.weight = self.tok.weight
        return self

    def forward(self, ids):
        s = ids.shape[1]
        if s > self.max_seq:
            raise ValueError(f"sequence length {s} is above the model's context of {self.max_seq}")
        x = self.tok(ids) + self.pos(torch.arange(s, device=ids.device))
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln(x))


def build(name):
    """The model for config `name` (a key of CONFIGS)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown language model config {name!r}; known: {', '.join(sorted(CONFIGS))}")
    return GPT(*CONFIGS[name])
