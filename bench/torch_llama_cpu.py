"""PyTorch peer of the trainer CPU benchmark for the Llama family: a Llama-style decoder trained with PyTorch
on CPU (what a user would pick instead), written plainly from the published definitions as
test/trainer/reference/make_families.py's llama model is (after Hugging Face's modeling_llama; transformers
is not imported): RMSNorm, q / k / v / o products and a fused gate_up product without biases, SwiGLU
(silu(gate) x up, then down), rotary positions in the rotate-half convention, grouped-query attention
(query head h reads key/value head h // (heads / kv_heads), HF repeat_kv), an untied classifier head.
Attention is torch's scaled_dot_product_attention(is_causal=True) where torch has it (2.0 and later: its
best CPU path), else the plain softmax(q k^T / sqrt(d) + causal mask) v of the GPT peer (Debian's 1.13).
Same conventions as shared/bench/torch_gpt_cpu.py: AdamW at 3e-4 over all parameters, random tokens, median
of the steps after the first two, one line of output. Model FLOPs per token = 6 N + 12 L T heads head_dim
(PaLM appendix B), N without the token embedding: untied, it is a lookup, not a product (the head counts).
Usage:
  python3 torch_llama_cpu.py --layers 6 --dmodel 384 --heads 6 --kv-heads 3 --ffn-hidden 1024 --vocab 8192 \
    --seq 256 --batch 8 --steps 8 --threads 2 --peak-gflops 175
"""
import argparse, time, math, torch, torch.nn as nn, torch.nn.functional as F

p = argparse.ArgumentParser()
for k, v in dict(layers=6, dmodel=384, heads=6, kv_heads=3, head_dim=0, ffn_hidden=0, vocab=8192, seq=256,
                 batch=8, steps=8, threads=2).items():
    p.add_argument('--' + k.replace('_', '-'), type=int, default=v)
p.add_argument('--rope-theta', type=float, default=5e5)
p.add_argument('--norm-eps', type=float, default=1e-5)
p.add_argument('--peak-gflops', type=float, default=175.0)
a = p.parse_args()
a.head_dim = a.head_dim or a.dmodel // a.heads
a.ffn_hidden = a.ffn_hidden or (8 * a.dmodel // 3 + 63) // 64 * 64  # the 8/3 rule rounded up to 64
assert a.heads % a.kv_heads == 0 and a.head_dim % 2 == 0
torch.set_num_threads(a.threads)
torch.manual_seed(0)
SDPA = hasattr(F, 'scaled_dot_product_attention')


class RMSNorm(nn.Module):  # HF LlamaRMSNorm: x * rsqrt(mean(x^2) + eps), times the weight
    def __init__(s, d, eps):
        super().__init__(); s.eps = eps; s.weight = nn.Parameter(torch.ones(d))
    def forward(s, x):
        return s.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    def __init__(s, d, h, kv, hd, hidden, eps):
        super().__init__(); s.h, s.kv, s.hd, s.hidden = h, kv, hd, hidden
        s.ln1 = RMSNorm(d, eps)
        s.q = nn.Linear(d, h * hd, bias=False); s.k = nn.Linear(d, kv * hd, bias=False)
        s.v = nn.Linear(d, kv * hd, bias=False); s.proj = nn.Linear(h * hd, d, bias=False)
        s.ln2 = RMSNorm(d, eps)
        s.gate_up = nn.Linear(d, 2 * hidden, bias=False); s.down = nn.Linear(hidden, d, bias=False)
    def forward(s, x, cos, sin):
        B, T, C = x.shape
        n = s.ln1(x)
        q = s.q(n).view(B, T, s.h, s.hd).transpose(1, 2)            # [B, heads, T, hd]
        k = s.k(n).view(B, T, s.kv, s.hd).transpose(1, 2)           # [B, kv_heads, T, hd]
        v = s.v(n).view(B, T, s.kv, s.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = s.h // s.kv                                            # HF repeat_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(s.hd)
            att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float('-inf')).softmax(-1)
            y = att @ v
        x = x + s.proj(y.transpose(1, 2).reshape(B, T, s.h * s.hd))
        g, u = s.gate_up(s.ln2(x)).chunk(2, dim=-1)
        return x + s.down(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte = nn.Embedding(a.vocab, a.dmodel)
        s.blocks = nn.ModuleList([Block(a.dmodel, a.heads, a.kv_heads, a.head_dim, a.ffn_hidden, a.norm_eps)
                                  for _ in range(a.layers)])
        s.lnf = RMSNorm(a.dmodel, a.norm_eps); s.head = nn.Linear(a.dmodel, a.vocab, bias=False)
        # Rotary tables for positions 0..T-1 (HF LlamaRotaryEmbedding, no scaling): [T, hd], shared by all
        # heads and rows.
        inv = 1.0 / (a.rope_theta ** (torch.arange(0, a.head_dim, 2, dtype=torch.int64).float() / a.head_dim))
        freqs = torch.arange(a.seq).float()[:, None] * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        s.register_buffer('cos', emb.cos(), persistent=False); s.register_buffer('sin', emb.sin(), persistent=False)
    def forward(s, idx, tgt):
        x = s.wte(idx)
        for b in s.blocks: x = b(x, s.cos, s.sin)
        logits = s.head(s.lnf(x))
        return F.cross_entropy(logits.view(-1, a.vocab), tgt.view(-1))


m = Llama(); opt = torch.optim.AdamW(m.parameters(), lr=3e-4)
n_all = sum(p.numel() for p in m.parameters())
n_params = n_all - a.vocab * a.dmodel  # the untied token embedding is a lookup
flops_per_token = 6 * n_params + 12 * a.layers * a.seq * a.heads * a.head_dim
times = []
for step in range(a.steps):
    idx = torch.randint(0, a.vocab, (a.batch, a.seq)); tgt = torch.randint(0, a.vocab, (a.batch, a.seq))
    t = time.perf_counter()
    loss = m(idx, tgt); opt.zero_grad(); loss.backward(); opt.step()
    times.append(time.perf_counter() - t)
dt = sorted(times[2:])[len(times[2:]) // 2]
tps = a.batch * a.seq / dt
print(f"params={n_all/1e6:.2f}M step_median={dt*1000:.0f}ms tokens_per_s={tps:.0f} "
      f"mfu={tps*flops_per_token/(a.peak_gflops*1e9)*100:.1f}% attention={'sdpa' if SDPA else 'math'}")
