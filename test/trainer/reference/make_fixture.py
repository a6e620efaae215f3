#!/usr/bin/python3
"""Writes gpt_parity.h5: a small GPT built in PyTorch from fixed initial weights, with its inputs, logits,
loss, every gradient, and ten AdamW steps (warm-up + cosine schedule, clipping, two accumulated
micro-batches); and a batch of packed documents (positions restarting per document, attention masked to
each document, per-token loss weights, ignored targets) with its logits, weighted loss and gradients; and
the DPO loss of two preference pairs (label smoothing on) with its gradients; the distillation loss of
the packed batch from a teacher of another size (temperature 2) with the student's gradients; and the GRPO
loss of four sampled replies in two groups (advantages from their rewards, clipped ratios against old
log-probabilities, the k3 KL to a reference), normalised per token and per sequence, with its gradients;
and the PPO loss of the same replies with a value head (advantages by GAE from the rollout's values, the
clipped value loss), per token and per sequence, with its gradients. test/trainer/parity_test.cpp checks the C++ trainer against it.

Run with Debian's torch:  /usr/bin/python3 test/trainer/reference/make_fixture.py
"""
import math, os
import h5py, numpy as np, torch, torch.nn as nn, torch.nn.functional as F

# Small, but crossing the kernels' internal blocks: T = 80 spans two attention row blocks (64) and
# B * T = 320 rows span two classifier chunks (256).
CFG = dict(layers=2, d_model=32, heads=4, vocab=64, seq_len=80, batch=4)
OPT = dict(lr=1e-2, min_lr=1e-3, warmup_steps=2, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8,
           grad_clip=1.0, steps=10, microbatches=2)
torch.manual_seed(20240601)
torch.set_num_threads(1)
L, C, NH, V, T, B = (CFG[k] for k in ("layers", "d_model", "heads", "vocab", "seq_len", "batch"))


class Block(nn.Module):
    def __init__(s, C=C):
        super().__init__()
        s.ln1 = nn.LayerNorm(C); s.qkv = nn.Linear(C, 3 * C); s.proj = nn.Linear(C, C)
        s.ln2 = nn.LayerNorm(C); s.fc = nn.Linear(C, 4 * C); s.fc2 = nn.Linear(4 * C, C)

    def forward(s, x):
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + s.proj(y)
        return x + s.fc2(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, L=L, C=C):
        super().__init__()
        s.wte = nn.Embedding(V, C); s.wpe = nn.Embedding(T, C)
        s.blocks = nn.ModuleList([Block(C) for _ in range(L)]); s.lnf = nn.LayerNorm(C)

    def logits(s, idx):
        x = s.wte(idx) + s.wpe(torch.arange(T))
        for b in s.blocks: x = b(x)
        return s.lnf(x) @ s.wte.weight.t()

    def forward(s, idx, tgt):
        return F.cross_entropy(s.logits(idx).reshape(-1, V), tgt.reshape(-1))


def named(m):
    """Our logical parameter names -> torch parameters."""
    out = {"wte.weight": m.wte.weight, "wpe.weight": m.wpe.weight}
    for i, b in enumerate(m.blocks):
        for ours, mod in (("ln1", b.ln1), ("attn.qkv", b.qkv), ("attn.proj", b.proj), ("ln2", b.ln2),
                          ("mlp.fc", b.fc), ("mlp.proj", b.fc2)):
            out[f"blocks.{i}.{ours}.weight"] = mod.weight
            out[f"blocks.{i}.{ours}.bias"] = mod.bias
    out["lnf.weight"] = m.lnf.weight; out["lnf.bias"] = m.lnf.bias
    return out


m = GPT()
params = named(m)
with torch.no_grad():  # non-trivial norms and biases, so their gradients are exercised too
    for name, p in params.items():
        if p.dim() == 2:
            p.normal_(0, 0.02 if "proj" not in name else 0.02 / math.sqrt(2 * L))
        elif name.endswith("weight"):
            p.copy_(1 + 0.1 * torch.randn_like(p))
        else:
            p.copy_(0.02 * torch.randn_like(p))
init = {k: v.detach().clone() for k, v in params.items()}

idx = torch.randint(0, V, (B, T)); tgt = torch.randint(0, V, (B, T))
logits = m.logits(idx)
loss = F.cross_entropy(logits.view(-1, V), tgt.view(-1))
loss.backward()
grads = {k: v.grad.detach().clone() for k, v in params.items()}


def lr_at(step):  # step counts from 0; mirrors forge::trainer::learning_rate
    if step < OPT["warmup_steps"]:
        return OPT["lr"] * (step + 1) / OPT["warmup_steps"]
    progress = min(1.0, (step - OPT["warmup_steps"]) / (OPT["steps"] - OPT["warmup_steps"]))
    return OPT["min_lr"] + 0.5 * (1 + math.cos(math.pi * progress)) * (OPT["lr"] - OPT["min_lr"])


decay = [p for k, p in params.items() if p.dim() == 2]
no_decay = [p for k, p in params.items() if p.dim() != 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPT["weight_decay"]},
                         {"params": no_decay, "weight_decay": 0.0}],
                        lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"])
# A stream with structure (each token usually follows from the previous one) so the loss moves.
mb = OPT["microbatches"]
stream = torch.randint(0, V, (OPT["steps"], mb * B, T + 1))
for s in range(OPT["steps"]):
    for r in range(mb * B):
        for t in range(1, T + 1):
            if (s * 7 + r * 3 + t) % 4 != 0:
                stream[s, r, t] = (stream[s, r, t - 1] * 5 + 3) % V
losses, norms = [], []
for s in range(OPT["steps"]):
    opt.zero_grad()
    total = 0.0
    for k in range(mb):
        rows = stream[s, k * B:(k + 1) * B]
        l = m(rows[:, :T], rows[:, 1:]) / mb
        l.backward()
        total += l.item()
    norms.append(torch.nn.utils.clip_grad_norm_(list(params.values()), OPT["grad_clip"]).item())
    for g in opt.param_groups:
        g["lr"] = lr_at(s)
    opt.step()
    losses.append(total)

# Packed documents, from the initial weights: two rows; row 0 holds three documents (boundaries inside and
# across the 64-row attention blocks), row 1 one. Loss = sum of weight x cross-entropy / sum of weights.
final = {k: v.detach().clone() for k, v in params.items()}
with torch.no_grad():
    for k, p in params.items(): p.copy_(init[k]); p.grad = None
PB = 2
p_idx = torch.randint(0, V, (PB, T)); p_tgt = torch.randint(0, V, (PB, T))
starts = [[20, 70], []]
p_seg = torch.zeros(PB, T, dtype=torch.long); p_pos = torch.zeros(PB, T, dtype=torch.long)
for r, cuts in enumerate(starts):
    for t in range(T):
        seg = sum(1 for c in cuts if c <= t)
        p_seg[r, t] = seg
        p_pos[r, t] = t - max([0] + [c for c in cuts if c <= t])
p_w = torch.tensor([0.0, 0.5, 1.0, 2.0])[torch.randint(0, 4, (PB, T))]
p_tgt[0, 19] = -1; p_tgt[0, 69] = -1; p_w[0, 19] = 0.0; p_w[0, 69] = 0.0  # the targets that open a document
p_tgt[1, 5] = -1; p_w[1, 5] = 0.0


def packed_logits(idx, pos, seg, m=m):
    C = m.lnf.weight.shape[0]
    x = m.wte(idx) + m.wpe(pos)
    same = seg[:, None, :, None] == seg[:, None, None, :]  # [B, 1, T, T]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    allowed = same & causal
    for b in m.blocks:
        q, k, v = b.qkv(b.ln1(x)).split(C, dim=2)
        q, k, v = [t.view(PB, T, NH, C // NH).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        att = att.masked_fill(~allowed, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(PB, T, C)
        x = x + b.proj(y)
        x = x + b.fc2(F.gelu(b.fc(b.ln2(x)), approximate="tanh"))
    return m.lnf(x) @ m.wte.weight.t()


p_logits = packed_logits(p_idx, p_pos, p_seg)
ce = F.cross_entropy(p_logits.reshape(-1, V), p_tgt.reshape(-1).clamp(min=0), reduction="none")
p_loss = (ce * p_w.reshape(-1)).sum() / p_w.sum()
p_loss.backward()
p_grads = {k: v.grad.detach().clone() for k, v in params.items()}

# DPO, from the initial weights: two rows, each a pair (chosen = document 0, rejected = document 1, then
# unscored filler); a prompt part of each reply unscored. Per pair z = beta((pi_c - ref_c) - (pi_r - ref_r)),
# loss = mean over pairs of -(1 - eps) logsigmoid(z) - eps logsigmoid(-z).
with torch.no_grad():
    for k, p in params.items(): p.copy_(init[k]); p.grad = None
DPO = dict(beta=0.5, label_smoothing=0.1)
d_idx = torch.randint(0, V, (PB, T)); d_tgt = torch.randint(0, V, (PB, T))
d_cuts = [(30, 66), (41, 80)]  # rejected starts, filler starts (80 = none)
d_seg = torch.zeros(PB, T, dtype=torch.long); d_pos = torch.zeros(PB, T, dtype=torch.long)
d_w = torch.ones(PB, T)
for r, (c, e) in enumerate(d_cuts):
    for t in range(T):
        seg = 0 if t < c else 1 if t < e else 2
        start = 0 if seg == 0 else c if seg == 1 else e
        d_seg[r, t] = seg; d_pos[r, t] = t - start
        if t - start < 10 or seg == 2: d_w[r, t] = 0.0  # the prompt and the filler are not scored
    d_tgt[r, c - 1] = -1; d_w[r, c - 1] = 0.0
    if e < T: d_tgt[r, e - 1] = -1; d_w[r, e - 1] = 0.0
d_logits = packed_logits(d_idx, d_pos, d_seg)
d_logp = -F.cross_entropy(d_logits.reshape(-1, V), d_tgt.reshape(-1).clamp(min=0), reduction="none").view(PB, T)
pi_c = (d_logp * d_w * (d_seg == 0)).sum(1); pi_r = (d_logp * d_w * (d_seg == 1)).sum(1)
d_ref = torch.stack([pi_c.detach() + torch.tensor([0.4, -0.2]), pi_r.detach() + torch.tensor([-0.3, 0.5])], 1).double()
z = DPO["beta"] * ((pi_c.double() - d_ref[:, 0]) - (pi_r.double() - d_ref[:, 1]))
eps = DPO["label_smoothing"]
d_loss = (-(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)).mean()
d_loss.backward()
d_grads = {k: v.grad.detach().clone() for k, v in params.items()}

# Distillation of the packed batch, from the initial weights, by a teacher with 3 blocks of width 48 (its
# own random weights, sharpened so its distribution is far from the student's). Per scored position
# alpha T^2 KL(softmax(t / T) || softmax(s / T)) + (1 - alpha) CE, weighted, over the sum of weights.
with torch.no_grad():
    for k, p in params.items(): p.copy_(init[k]); p.grad = None
DISTILL = dict(alpha=0.3, temperature=2.0, layers=3, d_model=48)
teacher = GPT(DISTILL["layers"], DISTILL["d_model"])
with torch.no_grad(): teacher.wte.weight.mul_(3.0)
t_params = named(teacher)
with torch.no_grad(): t_logits = packed_logits(p_idx, p_pos, p_seg, teacher)
s_logits = packed_logits(p_idx, p_pos, p_seg)
Tm, alpha = DISTILL["temperature"], DISTILL["alpha"]
log_pt = F.log_softmax(t_logits / Tm, -1); log_ps = F.log_softmax(s_logits / Tm, -1)
kl = (log_pt.exp() * (log_pt - log_ps)).sum(-1).reshape(-1)
ce = F.cross_entropy(s_logits.reshape(-1, V), p_tgt.reshape(-1).clamp(min=0), reduction="none")
w = p_w.reshape(-1)
t_loss = ((alpha * Tm * Tm * kl + (1 - alpha) * ce) * w).sum() / w.sum()
t_kl = (kl * w).sum() / w.sum()
t_loss.backward()
t_grads = {k: v.grad.detach().clone() for k, v in params.items()}

# GRPO, from the initial weights: four replies in two groups of two, each after a 20-token prompt (not
# scored), the last one ending early. Advantages: the reward minus its group's mean over the group's
# standard deviation (unbiased) + 1e-4. Per scored token, with r = exp(logp - old):
# -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) + kl_coef (exp(ref - logp) - (ref - logp) - 1),
# averaged over the scored tokens (token) or over each reply's, then the replies (sequence).
with torch.no_grad():
    for k, p in params.items(): p.copy_(init[k]); p.grad = None
GRPO = dict(group_size=2, clip_low=0.2, clip_high=0.28, kl_coef=0.05)
g_idx = torch.randint(0, V, (B, T)); g_tgt = torch.randint(0, V, (B, T))
g_w = torch.ones(B, T)
g_w[:, :20] = 0.0; g_tgt[:, :20] = -1
g_w[3, 65:] = 0.0; g_tgt[3, 65:] = -1
g_rewards = torch.tensor([1.0, 0.0, 0.2, 0.9])
grouped = g_rewards.view(-1, GRPO["group_size"])
g_adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
with torch.no_grad():
    logp0 = -F.cross_entropy(m.logits(g_idx).reshape(-1, V), g_tgt.reshape(-1).clamp(min=0), reduction="none").view(B, T)
g_old = logp0 + 0.3 * torch.randn(B, T)
g_ref = logp0 + 0.2 * torch.randn(B, T)


def grpo_loss(norm):
    logp = -F.cross_entropy(m.logits(g_idx).reshape(-1, V), g_tgt.reshape(-1).clamp(min=0), reduction="none").view(B, T)
    ratio = torch.exp(logp - g_old)
    A = g_adv[:, None]
    clipped = ratio.clamp(1 - GRPO["clip_low"], 1 + GRPO["clip_high"])
    per = -torch.min(ratio * A, clipped * A) + GRPO["kl_coef"] * (torch.exp(g_ref - logp) - (g_ref - logp) - 1)
    if norm == "token": return (per * g_w).sum() / g_w.sum()
    return ((per * g_w).sum(1) / g_w.sum(1)).mean()


g_loss, g_grads = {}, {}
for norm in ("token", "sequence"):
    for p in params.values(): p.grad = None
    loss_n = grpo_loss(norm)
    loss_n.backward()
    g_loss[norm] = loss_n.item()
    g_grads[norm] = {k: v.grad.detach().clone() for k, v in params.items()}

# PPO, from the initial weights, on the GRPO replies: a value head (weight [1, C], bias [1]) on the final
# norm's output; each reply's reward at its last scored token; along its scored tokens, generalised
# advantage estimation from the rollout's values (the head's, perturbed: old_values) with the value after
# the last token 0; GRPO's clipped term and KL with those advantages, plus
# value_coef 0.5 max((V - G)^2, (V_old + clip(V - V_old, -value_clip, value_clip) - G)^2), G = A + V_old.
with torch.no_grad():
    for k, p in params.items(): p.copy_(init[k]); p.grad = None
PPO = dict(gamma=0.9, lam=0.8, value_coef=0.5, value_clip=0.05)
v_w = nn.Parameter(0.3 * torch.randn(1, C)); v_b = nn.Parameter(torch.tensor([0.1]))
ppo_params = dict(params, **{"value_head.weight": v_w, "value_head.bias": v_b})


def values_of(idx):
    x = m.wte(idx) + m.wpe(torch.arange(T))
    for b in m.blocks: x = b(x)
    return (m.lnf(x) @ v_w.t() + v_b).squeeze(-1)


with torch.no_grad(): v_old = values_of(g_idx) + 0.1 * torch.randn(B, T)
v_adv, v_ret = torch.zeros(B, T), torch.zeros(B, T)
for r in range(B):
    scored = [t for t in range(T) if g_w[r, t] > 0]
    next_value, next_adv = 0.0, 0.0
    for k in reversed(range(len(scored))):
        t = scored[k]
        reward = float(g_rewards[r]) if k == len(scored) - 1 else 0.0
        next_adv = reward + PPO["gamma"] * next_value - float(v_old[r, t]) + PPO["gamma"] * PPO["lam"] * next_adv
        v_adv[r, t] = next_adv; v_ret[r, t] = next_adv + float(v_old[r, t]); next_value = float(v_old[r, t])


def ppo_loss(norm):
    logp = -F.cross_entropy(m.logits(g_idx).reshape(-1, V), g_tgt.reshape(-1).clamp(min=0), reduction="none").view(B, T)
    ratio = torch.exp(logp - g_old)
    clipped = ratio.clamp(1 - GRPO["clip_low"], 1 + GRPO["clip_high"])
    per = -torch.min(ratio * v_adv, clipped * v_adv) + GRPO["kl_coef"] * (torch.exp(g_ref - logp) - (g_ref - logp) - 1)
    v = values_of(g_idx)
    held = v_old + (v - v_old).clamp(-PPO["value_clip"], PPO["value_clip"])
    per = per + PPO["value_coef"] * 0.5 * torch.max((v - v_ret) ** 2, (held - v_ret) ** 2)
    if norm == "token": return (per * g_w).sum() / g_w.sum()
    return ((per * g_w).sum(1) / g_w.sum(1)).mean()


v_loss, v_grads = {}, {}
for norm in ("token", "sequence"):
    for p in ppo_params.values(): p.grad = None
    loss_n = ppo_loss(norm)
    loss_n.backward()
    v_loss[norm] = loss_n.item()
    v_grads[norm] = {k: v.grad.detach().clone() for k, v in ppo_params.items()}

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_parity.h5")
with h5py.File(path, "w") as f:
    for k, v in CFG.items(): f.attrs[k] = v
    for k, v in OPT.items(): f.attrs[k] = v
    f["tokens"] = idx.numpy().astype(np.int32); f["targets"] = tgt.numpy().astype(np.int32)
    f["logits"] = logits.detach().numpy().astype(np.float32)
    f["loss"] = np.float32(loss.item())
    for k in params:
        f[f"init/{k}"] = init[k].numpy()
        f[f"grad/{k}"] = grads[k].numpy()
        f[f"final/{k}"] = final[k].numpy()
    f["steps/tokens"] = stream.numpy().astype(np.int32)
    f["steps/loss"] = np.array(losses, dtype=np.float64)
    f["steps/grad_norm"] = np.array(norms, dtype=np.float64)
    f["packed/tokens"] = p_idx.numpy().astype(np.int32); f["packed/targets"] = p_tgt.numpy().astype(np.int32)
    f["packed/weights"] = p_w.numpy().astype(np.float32)
    f["packed/positions"] = p_pos.numpy().astype(np.int32); f["packed/segments"] = p_seg.numpy().astype(np.int32)
    f["packed/logits"] = p_logits.detach().numpy().astype(np.float32)
    f["packed/loss"] = np.float64(p_loss.item())
    for k in params: f[f"packed/grad/{k}"] = p_grads[k].numpy()
    g = f.create_group("dpo") if "dpo" not in f else f["dpo"]
    for k, v in DPO.items(): g.attrs[k] = v
    g["tokens"] = d_idx.numpy().astype(np.int32); g["targets"] = d_tgt.numpy().astype(np.int32)
    g["weights"] = d_w.numpy().astype(np.float32)
    g["positions"] = d_pos.numpy().astype(np.int32); g["segments"] = d_seg.numpy().astype(np.int32)
    g["reference_logps"] = d_ref.reshape(-1).numpy().astype(np.float64)
    g["loss"] = np.float64(d_loss.item())
    for k in params: g[f"grad/{k}"] = d_grads[k].numpy()
    g = f.create_group("distill")
    for k, v in DISTILL.items(): g.attrs[k] = v
    for k, p in t_params.items(): g[f"teacher/{k}"] = p.detach().numpy()
    g["loss"] = np.float64(t_loss.item()); g["kl"] = np.float64(t_kl.item())
    for k in params: g[f"grad/{k}"] = t_grads[k].numpy()
    g = f.create_group("grpo")
    for k, v in GRPO.items(): g.attrs[k] = v
    g["tokens"] = g_idx.numpy().astype(np.int32); g["targets"] = g_tgt.numpy().astype(np.int32)
    g["weights"] = g_w.numpy().astype(np.float32)
    g["rewards"] = g_rewards.numpy().astype(np.float32); g["advantages"] = g_adv.numpy().astype(np.float32)
    g["old_logps"] = g_old.numpy().astype(np.float32); g["ref_logps"] = g_ref.numpy().astype(np.float32)
    for norm in ("token", "sequence"):
        g[f"{norm}/loss"] = np.float64(g_loss[norm])
        for k in params: g[f"{norm}/grad/{k}"] = g_grads[norm][k].numpy()
    g = f.create_group("ppo")
    for k, v in PPO.items(): g.attrs[k] = v
    g["init/value_head.weight"] = v_w.detach().numpy(); g["init/value_head.bias"] = v_b.detach().numpy()
    g["old_values"] = v_old.numpy().astype(np.float32); g["advantages"] = v_adv.numpy().astype(np.float32)
    for norm in ("token", "sequence"):
        g[f"{norm}/loss"] = np.float64(v_loss[norm])
        for k in ppo_params: g[f"{norm}/grad/{k}"] = v_grads[norm][k].numpy()
print(f"wrote {path}: loss {loss.item():.6f}, step losses {[round(x, 4) for x in losses]}, norms "
      f"{[round(x, 3) for x in norms]}")
