"""PyTorch peer of the vision tower benchmark (bench/vision.sh): the same encoder and projector as forge's
(trainer/src/vision.h, after SigLIP's vision transformer and LLaVA's projector, as
test/trainer/reference/make_vision.py writes them), built from torch.nn layers as a user would: a strided
Conv2d patch embedding with a bias, a learned position per patch, pre-norm blocks (LayerNorm, a fused q|k|v
Linear, bidirectional attention, an output Linear, LayerNorm, Linear, tanh GELU, Linear), a final
LayerNorm, and the projector (Linear, tanh GELU, Linear). Attention is torch's
scaled_dot_product_attention where torch has it (2.0 and later), else softmax(q k^T / sqrt(d)) v. Times the
forward and backward of the tower alone on random pictures (a sum of the features as the loss), the median
of the reps after a warm-up; one line of output.
Usage:
  python3 torch_vision_cpu.py --pictures 16 --image-size 112 --patch 14 --width 384 --layers 6 --heads 6 \
    --mlp-hidden 1536 --projector 384 --out 384 --threads 2 --reps 5
"""
import argparse, statistics, time, torch, torch.nn as nn, torch.nn.functional as F

p = argparse.ArgumentParser()
for k, v in dict(pictures=16, image_size=112, patch=14, width=384, layers=6, heads=6, mlp_hidden=1536,
                 projector=384, out=384, threads=2, reps=5).items():
    p.add_argument('--' + k.replace('_', '-'), type=int, default=v)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
SDPA = hasattr(F, 'scaled_dot_product_attention')
T = (a.image_size // a.patch) ** 2


class Block(nn.Module):
    def __init__(s, w, h, hidden):
        super().__init__(); s.h = h
        s.ln1 = nn.LayerNorm(w); s.qkv = nn.Linear(w, 3 * w); s.proj = nn.Linear(w, w)
        s.ln2 = nn.LayerNorm(w); s.fc = nn.Linear(w, hidden); s.fc_proj = nn.Linear(hidden, w)
    def forward(s, x):
        n, t, w = x.shape
        q, k, v = (z.view(n, t, s.h, w // s.h).transpose(1, 2) for z in s.qkv(s.ln1(x)).split(w, dim=-1))
        if SDPA:
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            y = torch.softmax(q @ k.transpose(-1, -2) / (w // s.h) ** 0.5, dim=-1) @ v
        x = x + s.proj(y.transpose(1, 2).reshape(n, t, w))
        return x + s.fc_proj(F.gelu(s.fc(s.ln2(x)), approximate='tanh'))


class Tower(nn.Module):
    def __init__(s):
        super().__init__()
        s.patch = nn.Conv2d(3, a.width, a.patch, stride=a.patch)
        s.pos = nn.Parameter(torch.randn(T, a.width) * 0.02)
        s.blocks = nn.ModuleList(Block(a.width, a.heads, a.mlp_hidden) for _ in range(a.layers))
        s.ln_post = nn.LayerNorm(a.width)
        s.fc1 = nn.Linear(a.width, a.projector); s.fc2 = nn.Linear(a.projector, a.out)
    def forward(s, pixels):  # [n, 3, S, S], normalised
        x = s.patch(pixels).flatten(2).transpose(1, 2) + s.pos
        for b in s.blocks:
            x = b(x)
        return s.fc2(F.gelu(s.fc1(s.ln_post(x)), approximate='tanh'))


tower = Tower()
pixels = torch.randint(0, 256, (a.pictures, a.image_size, a.image_size, 3)).float().permute(0, 3, 1, 2)
pixels = (pixels / 127.5 - 1).contiguous()
times = []
for r in range(a.reps + 1):
    t0 = time.perf_counter()
    tower.zero_grad(set_to_none=False)
    tower(pixels).sum().backward()
    if r > 0:
        times.append(time.perf_counter() - t0)
med = statistics.median(times)
print(f"torch_tower_ms={med * 1e3:.1f} pictures_per_s={a.pictures / med:.1f} torch={torch.__version__} "
      f"sdpa={SDPA} threads={a.threads}")
