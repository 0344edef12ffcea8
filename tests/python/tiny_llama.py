"""A Llama 3 shaped model with torchtitan's module and parameter names (tok_embeddings, layers.N
with attention.wq/wk/wv/wo, feed_forward.w1/w2/w3, attention_norm, ffn_norm; norm; output),
small enough for tests. Deterministic kernels only: attention is written out as matmul +
softmax (no fused SDPA, whose backward may use atomics), RoPE omitted (it has no parameters
and changes no communication).

Also the recordings' model of plans/fsdp4.lua (FSDP4Model): three layers of odd-sized
parameters and a root holding the embedding, norm and output.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

LLAMA_TINY = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=250, multiple_of=16,
                  ffn_dim_multiplier=1.3)


def ffn_hidden(dim, multiplier, multiple_of):
    hidden = (2 * 4 * dim) // 3
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        rep = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-2, -1)) * (self.head_dim ** -0.5)
        mask = torch.full((s, s), float("-inf"), device=x.device, dtype=scores.dtype).triu(1)
        att = torch.softmax((scores + mask).float(), dim=-1).type_as(q)
        out = (att @ v).transpose(1, 2).reshape(b, s, -1)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, hidden):
        super().__init__()
        self.attention = Attention(dim, n_heads, n_kv_heads)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm = RMSNorm(dim)
        self.ffn_norm = RMSNorm(dim)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, dim, n_layers, n_heads, n_kv_heads, vocab_size, multiple_of=256, ffn_dim_multiplier=None):
        super().__init__()
        hidden = ffn_hidden(dim, ffn_dim_multiplier, multiple_of)
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(dim, n_heads, n_kv_heads, hidden)
                                     for i in range(n_layers)})
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h)
        # torchtitan's _skip_lm_head (models/common/decoder.py:242-247): ChunkedLossWrapper runs the head
        return h if getattr(self, "_skip_lm_head", False) else self.output(h)


def init_weights(model, seed):
    """Deterministic values on the CPU (the same on every rank and every run), then moved by the caller."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05 + (1.0 if p.dim() == 1 else 0.0))


class _P(nn.Module):
    """Holds parameters under the names the fsdp4 recording uses (layers.<b>.p.<name>)."""

    def __init__(self, shapes):
        super().__init__()
        for n, s in shapes:
            setattr(self, n, nn.Parameter(torch.zeros(s)))


class FSDP4Layer(nn.Module):
    SHAPES = [("wq", (12, 12)), ("wk", (4, 12)), ("wv", (4, 12)), ("wo", (12, 12)), ("w1", (20, 12)),
              ("w2", (12, 20)), ("w3", (20, 12)), ("attn_norm", (12,)), ("ffn_norm", (12,)), ("bias", (5,)),
              ("tiny", (2, 3))]

    def __init__(self):
        super().__init__()
        self.p = _P(self.SHAPES)


class FSDP4Model(nn.Module):
    """plans/fsdp4.lua's model: its parameter names are root.tok_embeddings, root.norm and
    root.output for the root's own, layers.<b>.p.<name> for the layers'."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([FSDP4Layer() for _ in range(3)])
        self.root = _P([("tok_embeddings", (37, 12)), ("norm", (12,)), ("output", (37, 12))])
