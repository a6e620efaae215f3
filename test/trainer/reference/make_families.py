#!/usr/bin/python3
"""Writes families_parity.h5: six tiny decoder models of today's families -- llama (Llama 3 rotary scaling),
qwen2 (q/k/v biases, tied embeddings), qwen3 (per-head q/k RMSNorm, head_dim != d_model / heads), mistral
(sliding-window attention), mixtral (MoE, gates renormalised over the top-k) and qwen2_moe (MoE, gates not
renormalised, a sigmoid-gated shared expert) -- written here in plain PyTorch after Hugging Face
transformers' modeling_llama / qwen2 / qwen3 / mistral / mixtral / qwen2_moe (transformers is not imported),
from fixed initial weights, with their inputs, logits, loss and every parameter gradient. For mistral also a
batch of packed documents (positions restarting per document, attention masked to each document and to the
window, per-token loss weights, ignored targets) with its logits, weighted loss and gradients.
The C++ trainer is checked against it.

Layout: one group per family ("llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen2_moe"); its attributes
hold the configuration (int64 / float64; "family" and "rope_scaling" are strings); datasets init/<param>,
tokens [B, T] and targets [B, T] (int32), logits [B, T, V], loss [1] (LM cross-entropy, mean over the B*T
tokens, plus for MoE families the router aux and z losses of every block), loss_lm [1] (cross-entropy
alone), grad/<param> (of loss), rope_inv_freq [head_dim / 2] (float64, after scaling). MoE families also
have router_aux [layers] and router_z [layers] (float64, already multiplied by their coefficients) and
routing/blocks.<i>.expert_index [B*T, top_k] (int32, descending probability). mistral/packed holds tokens,
targets, weights, positions, segments, logits, loss (sum of weight x cross-entropy / sum of weights) and
grad/<param>, as make_fixture.py's packed batch.

Precision: weights and inputs are drawn in float32 (matrices rounded to multiples of a power of two near
std / 8, so that shuffle + deflate shrink them; they are exact float32 numbers all the same), the models are
computed in float64 from exactly those values (autograd in float64), and results are stored as float32
(losses, router losses and inverse frequencies as float64), so the reference is more exact than the float32
C++ it checks. One chunk per dataset, gzip 9 + shuffle on those over 64 elements, the HDF5 1.10 format, no
timestamps: every run writes the same bytes, about 1.48 MB.

Run with Debian's torch:  /usr/bin/python3 test/trainer/reference/make_families.py
"""
import math, os
import h5py, numpy as np, torch, torch.nn.functional as F

torch.set_num_threads(1)
torch.set_default_dtype(torch.float64)

COMMON = dict(layers=2, d_model=32, heads=4, kv_heads=2, head_dim=8, vocab=64, seq_len=80, batch=2,
              ffn_hidden=0, moe_hidden=0, shared_expert_hidden=0, experts=0, top_k=0, router_renormalize=0,
              norm_eps=1e-5, rope_theta=1e6, rope_scaling="none", rope_factor=1.0, rope_low_freq_factor=1.0,
              rope_high_freq_factor=4.0, rope_original_positions=0, window=0, qkv_bias=0, qk_norm=0,
              tied_embeddings=0, router_aux_coef=1e-2, router_z_coef=1e-3)
FAMILIES = {
    # rope_original_positions 256, not 64: with theta 5e5 and head_dim 8 the wavelengths are 6.3, 167, 4443
    # and 118,000 positions, so 64 would leave none in the ramp; 256 puts 167 in it (asserted below).
    "llama": dict(norm_eps=1e-5, ffn_hidden=96, rope_theta=5e5, rope_scaling="llama3", rope_factor=8.0,
                  rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_positions=256),
    "qwen2": dict(norm_eps=1e-6, ffn_hidden=96, qkv_bias=1, tied_embeddings=1),
    "qwen3": dict(norm_eps=1e-6, ffn_hidden=96, head_dim=16, qk_norm=1),
    "mistral": dict(norm_eps=1e-5, ffn_hidden=96, window=24),
    "mixtral": dict(norm_eps=1e-5, experts=4, top_k=2, moe_hidden=48, router_renormalize=1),
    "qwen2_moe": dict(norm_eps=1e-6, experts=4, top_k=2, moe_hidden=32, shared_expert_hidden=64, qkv_bias=1,
                      tied_embeddings=1),
}
SEEDS = dict(llama=20240701, qwen2=20240702, qwen3=20240703, mistral=20240704, mixtral=20240705,
             qwen2_moe=20240726)
# Initial weights: matrices N(0, 0.02), the output projections (attn.proj, mlp/moe down) 0.02 / sqrt(2 L);
# norm weights 1 + 0.1 N(0, 1); biases 0.02 N(0, 1); router N(0, 0.5) (decisive routing, as
# make_moe_fixture.py). Departures, so that every part visibly moves the logits (measured with the seeds
# below; the C++ side compares logits to ~1e-5 of their largest magnitude):
#   q and k N(0, 0.25): with 0.02 the scores are ~1e-2, attention is nearly uniform, and turning rotary off
#     moves the logits by only 1e-4 to 5e-3 of their largest (4e-2 to 0.1 with 0.25; asserted > 1e-2);
#   wte N(0, 0.05): with 0.02 the tied families' logits stay under 0.8 (loss ln 64 to 3 digits); with 0.2
#     the embedding drowns the blocks' output in the residual stream (rotary then moves logits by ~2%);
#   head N(0, 0.2) (untied only): logits up to ~4.
# Matrices are rounded to multiples of a power of two near std / 8 (exact in float32, and compressible).
EMB_STD, HEAD_STD, QK_STD, STD, ROUTER_STD = 0.05, 0.2, 0.25, 0.02, 0.5
TIE_GAP = 1e-4  # routing decisions must not hinge on float32 rounding


# ----------------------------------------------------------------------------------------------- rotary
def inv_freq_of(c):
    """HF modeling_rope_utils: _compute_default_rope_parameters, and _compute_llama3_parameters for llama3,
    in float64. Returns (inv_freq [hd/2], categories) where categories lists, per frequency, kept / divided /
    smoothed (llama3 only)."""
    hd = c["head_dim"]
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).double() / hd))
    if c["rope_scaling"] == "none":
        return inv, None
    assert c["rope_scaling"] == "llama3"
    factor, low, high = c["rope_factor"], c["rope_low_freq_factor"], c["rope_high_freq_factor"]
    old = c["rope_original_positions"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    out = torch.where(medium, smoothed, inv_l)
    cats = ["smoothed" if m else "divided" if w > low_wavelen else "kept" for w, m in zip(wavelen.tolist(),
                                                                                          medium.tolist())]
    # none on a boundary, where float rounding could flip the category
    for w in wavelen.tolist():
        assert min(abs(w - low_wavelen), abs(w - high_wavelen)) > 1e-3 * w
    return out, cats


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(inv, pos):
    """pos [B, T] -> cos, sin [B, 1, T, hd] (HF LlamaRotaryEmbedding.forward, in float64)."""
    freqs = pos.double()[..., None] * inv          # [B, T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[:, None], emb.sin()[:, None]


def apply_rope(x, cos, sin):  # HF apply_rotary_pos_emb, x [B, heads, T, hd]
    return x * cos + rotate_half(x) * sin


def apply_rope_complex(x, inv, pos):
    """Independent formulation: pairs (x_i, x_{i + hd/2}) as complex numbers times exp(i pos inv_freq_i)."""
    h = x.shape[-1] // 2
    z = torch.complex(x[..., :h], x[..., h:])
    ang = pos.double()[:, None, :, None] * inv     # [B, 1, T, hd/2]
    r = z * torch.polar(torch.ones_like(ang), ang)
    return torch.cat((r.real, r.imag), dim=-1)


# ---------------------------------------------------------------------------------------------- the model
def rms_norm(x, w, eps):  # HF LlamaRMSNorm: x * rsqrt(mean(x^2) + eps), times the weight
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def swiglu(x, gate_up, down):  # gate_up [2H, C]: rows 0..H-1 gate, H..2H-1 up
    g, u = (x @ gate_up.t()).chunk(2, dim=-1)
    return (F.silu(g) * u) @ down.t()


def param_shapes(c):
    C, NH, KV, hd, V, L = c["d_model"], c["heads"], c["kv_heads"], c["head_dim"], c["vocab"], c["layers"]
    s = {"wte.weight": (V, C)}
    if not c["tied_embeddings"]: s["head.weight"] = (V, C)
    for i in range(L):
        b = f"blocks.{i}."
        s[b + "ln1.weight"] = (C,)
        s[b + "attn.q.weight"] = (NH * hd, C); s[b + "attn.k.weight"] = (KV * hd, C)
        s[b + "attn.v.weight"] = (KV * hd, C)
        if c["qkv_bias"]:
            s[b + "attn.q.bias"] = (NH * hd,); s[b + "attn.k.bias"] = (KV * hd,); s[b + "attn.v.bias"] = (KV * hd,)
        if c["qk_norm"]:
            s[b + "attn.q_norm.weight"] = (hd,); s[b + "attn.k_norm.weight"] = (hd,)
        s[b + "attn.proj.weight"] = (C, NH * hd)
        s[b + "ln2.weight"] = (C,)
        if c["experts"] == 0:
            H = c["ffn_hidden"]
            s[b + "mlp.gate_up.weight"] = (2 * H, C); s[b + "mlp.down.weight"] = (C, H)
        else:
            E, H = c["experts"], c["moe_hidden"]
            s[b + "moe.router.weight"] = (E, C)
            s[b + "moe.gate_up.weight"] = (E, 2 * H, C); s[b + "moe.down.weight"] = (E, C, H)
            if c["shared_expert_hidden"]:
                Hs = c["shared_expert_hidden"]
                s[b + "moe.shared.gate_up.weight"] = (2 * Hs, C); s[b + "moe.shared.down.weight"] = (C, Hs)
                s[b + "moe.shared_gate.weight"] = (1, C)
    s["lnf.weight"] = (C,)
    return s


def draw_params(c, gen):
    """float32 initial weights, in the order of param_shapes."""
    out, L = {}, c["layers"]
    for name, shape in param_shapes(c).items():
        z = torch.randn(*shape, generator=gen, dtype=torch.float32)
        if name.endswith("bias"):
            w = 0.02 * z
        elif len(shape) == 1:  # norm weights
            w = 1 + 0.1 * z
        else:
            if name == "wte.weight": std = EMB_STD
            elif name == "head.weight": std = HEAD_STD
            elif "router" in name: std = ROUTER_STD
            elif name.endswith(("attn.q.weight", "attn.k.weight")): std = QK_STD
            elif name.endswith(("attn.proj.weight", "down.weight")): std = STD / math.sqrt(2 * L)
            else: std = STD
            step = 2.0 ** round(math.log2(std / 8))  # a power of two near std / 8: compressible, exact
            w = torch.round(std * z / step) * step
        out[name] = w
    return out


def route(c, h, Wr, strict=True):
    """Router of make_moe_fixture.py: softmax over experts, top-k by probability (stable, ties to the
    lower index). h [N, C]. Returns probs, lse, idx [N, k], gates [N, k]."""
    k = c["top_k"]
    logits = h @ Wr.t()
    probs = logits.softmax(dim=1)
    lse = torch.logsumexp(logits, dim=1)
    order = torch.sort(probs.detach(), dim=1, descending=True, stable=True).indices
    idx = order[:, :k]
    sp = probs.detach().gather(1, order)
    # the set and the order of the top-k must not hinge on rounding
    assert not strict or (sp[:, :k] - sp[:, 1:k + 1]).min().item() > TIE_GAP, ("near-tie in top-k; change the seed", c["family"])
    gates = probs.gather(1, idx)
    if c["router_renormalize"]:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return probs, lse, idx, gates


def moe(c, P, b, x, strict=True):
    """x [B, T, C] (already normed) -> out [B, T, C], aux, z, idx."""
    Bx, Tx, C = x.shape
    E, k = c["experts"], c["top_k"]
    h = x.reshape(-1, C)
    N = h.shape[0]
    probs, lse, idx, gates = route(c, h, P[b + "moe.router.weight"], strict)
    out = torch.zeros(N, C)
    for e in range(E):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        if tok.numel() == 0: continue
        y = swiglu(h[tok], P[b + "moe.gate_up.weight"][e], P[b + "moe.down.weight"][e])
        out = out.index_add(0, tok, gates[tok, slot][:, None] * y)
    if c["shared_expert_hidden"]:
        sh = swiglu(h, P[b + "moe.shared.gate_up.weight"], P[b + "moe.shared.down.weight"])
        out = out + torch.sigmoid(h @ P[b + "moe.shared_gate.weight"].t()) * sh
    # aux: f_i from the top-k assignments (constant; dropless), P_i = mean probability of expert i
    f = torch.bincount(idx.reshape(-1), minlength=E).double() / (N * k)
    aux = c["router_aux_coef"] * E * (f * probs.mean(dim=0)).sum()
    z = c["router_z_coef"] * (lse ** 2).mean()
    return out.view(Bx, Tx, C), aux, z, idx


def attention_mask(T, seg, window):
    """allowed [B, 1, T, T]: causal, within the window (t - window < j <= t) and the same document."""
    t = torch.arange(T)
    allowed = t[None, :] <= t[:, None]
    if window: allowed = allowed & (t[None, :] > t[:, None] - window)
    return allowed[None, None] & (seg[:, None, :, None] == seg[:, None, None, :])


def forward(c, P, idx, pos, seg, rope=apply_rope, strict=True, embeds=None):
    """Logits [B, T, V] and, per MoE block, (aux, z, expert_index). strict: assert decisive routing (off for
    the diagnostic variants below, which only measure how much a feature moves the logits). embeds: the
    input embeddings [B, T, C] in place of the tokens' (a vision-language model's, pictures placed)."""
    Bx, T = idx.shape
    C, NH, KV, hd, eps = c["d_model"], c["heads"], c["kv_heads"], c["head_dim"], c["norm_eps"]
    inv, _ = inv_freq_of(c)
    cos, sin = rope_cos_sin(inv, pos)
    allowed = attention_mask(T, seg, c["window"])
    x = P["wte.weight"][idx] if embeds is None else embeds
    routers = []
    for i in range(c["layers"]):
        b = f"blocks.{i}."
        h = rms_norm(x, P[b + "ln1.weight"], eps)
        q, k, v = (h @ P[b + f"attn.{n}.weight"].t() for n in "qkv")
        if c["qkv_bias"]:
            q, k, v = q + P[b + "attn.q.bias"], k + P[b + "attn.k.bias"], v + P[b + "attn.v.bias"]
        q = q.view(Bx, T, NH, hd); k = k.view(Bx, T, KV, hd); v = v.view(Bx, T, KV, hd)
        if c["qk_norm"]:  # HF Qwen3: RMSNorm over each head's head_dim, before rotary
            q = rms_norm(q, P[b + "attn.q_norm.weight"], eps); k = rms_norm(k, P[b + "attn.k_norm.weight"], eps)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))          # [B, heads, T, hd]
        if rope is apply_rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        elif rope is not None:
            q, k = rope(q, inv, pos), rope(k, inv, pos)
        rep = NH // KV                                               # HF repeat_kv: query head h -> kv h // rep
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~allowed, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(Bx, T, NH * hd)
        x = x + y @ P[b + "attn.proj.weight"].t()
        h = rms_norm(x, P[b + "ln2.weight"], eps)
        if c["experts"] == 0:
            x = x + swiglu(h, P[b + "mlp.gate_up.weight"], P[b + "mlp.down.weight"])
        else:
            out, aux, z, eidx = moe(c, P, b, h, strict)
            x = x + out
            routers.append((aux, z, eidx))
    W = P["wte.weight"] if c["tied_embeddings"] else P["head.weight"]
    return rms_norm(x, P["lnf.weight"], eps) @ W.t(), routers


def leaf(init):
    return {k: v.double().requires_grad_(True) for k, v in init.items()}


def grads_of(P):
    return {k: p.grad.detach().clone() for k, p in P.items()}


# ------------------------------------------------------------------------------------------- the families
results = {}
for fam, over in FAMILIES.items():
    c = dict(COMMON, **over, family=fam)
    gen = torch.Generator().manual_seed(SEEDS[fam])
    init = draw_params(c, gen)
    B, T, V = c["batch"], c["seq_len"], c["vocab"]
    idx = torch.randint(0, V, (B, T), generator=gen)
    tgt = torch.randint(0, V, (B, T), generator=gen)
    pos = torch.arange(T).expand(B, T)
    seg = torch.zeros(B, T, dtype=torch.long)
    inv, cats = inv_freq_of(c)
    r = dict(cfg=c, init=init, tokens=idx, targets=tgt, inv_freq=inv)

    P = leaf(init)
    logits, routers = forward(c, P, idx, pos, seg)
    loss_lm = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))
    loss = loss_lm + sum(a + z for a, z, _ in routers)
    loss.backward()
    r.update(logits=logits.detach(), loss=loss.item(), loss_lm=loss_lm.item(), grads=grads_of(P),
             aux=[a.item() for a, _, _ in routers], z=[z.item() for _, z, _ in routers],
             expert_index=[e for _, _, e in routers])
    assert all(g.abs().max().item() > 0 for g in r["grads"].values()), "a parameter with no gradient"

    with torch.no_grad():
        Q = {k: v.double() for k, v in init.items()}
        if fam == "llama":  # llama3 scaling exercises all three branches; rotary = the complex formulation
            assert {"kept", "divided", "smoothed"} <= set(cats), cats
            x = torch.randn(B, 3, T, c["head_dim"], generator=gen, dtype=torch.float64)
            cos, sin = rope_cos_sin(inv, pos)
            d = (apply_rope(x, cos, sin) - apply_rope_complex(x, inv, pos)).abs().max().item()
            assert d < 1e-12, d
            lc, _ = forward(c, Q, idx, pos, seg, rope=apply_rope_complex)
            d = (lc - logits.detach()).abs().max().item()
            assert d < 1e-12, d
            r["rope_categories"] = cats
        if fam == "mistral":  # the window removes keys, and that changes the logits
            allowed = attention_mask(T, seg, c["window"])
            assert c["window"] < T and (attention_mask(T, seg, 0) & ~allowed).any()
            assert allowed.sum(-1).max().item() == c["window"]
            lw, _ = forward(dict(c, window=0), Q, idx, pos, seg, strict=False)
            r["window_effect"] = (lw - logits.detach()).abs().max().item() / logits.abs().max().item()
            assert r["window_effect"] > 1e-2, r["window_effect"]
        # rotary must visibly move the logits (the C++ tolerance is ~1e-5 of max |logit|)
        ln, _ = forward(c, Q, idx, pos, seg, rope=None, strict=False)
        r["rope_effect"] = (ln - logits.detach()).abs().max().item() / logits.abs().max().item()
        assert r["rope_effect"] > 1e-2, (fam, r["rope_effect"])

    if fam == "mistral":
        # Packed documents, as make_fixture.py's: row 0 holds three documents (starting at 0, 20, 70), row 1
        # one; positions restart per document; loss = sum of weight x cross-entropy / sum of weights (weights
        # 0, 0.5, 1, 2); targets -1 with weight 0 at row 0, t = 19 and 69 (they would be the next document's
        # first token) and row 1, t = 5. Document 1 of row 0 (50 tokens) and row 1 are longer than the window.
        PB = 2
        p_idx = torch.randint(0, V, (PB, T), generator=gen); p_tgt = torch.randint(0, V, (PB, T), generator=gen)
        starts = [[20, 70], []]
        p_seg = torch.zeros(PB, T, dtype=torch.long); p_pos = torch.zeros(PB, T, dtype=torch.long)
        for row, cuts in enumerate(starts):
            for t in range(T):
                p_seg[row, t] = sum(1 for cut in cuts if cut <= t)
                p_pos[row, t] = t - max([0] + [cut for cut in cuts if cut <= t])
        p_w = torch.tensor([0.0, 0.5, 1.0, 2.0])[torch.randint(0, 4, (PB, T), generator=gen)]
        p_tgt[0, 19] = -1; p_tgt[0, 69] = -1; p_w[0, 19] = 0.0; p_w[0, 69] = 0.0
        p_tgt[1, 5] = -1; p_w[1, 5] = 0.0
        P = leaf(init)
        p_logits, _ = forward(c, P, p_idx, p_pos, p_seg)
        ce = F.cross_entropy(p_logits.reshape(-1, V), p_tgt.reshape(-1).clamp(min=0), reduction="none")
        p_loss = (ce * p_w.reshape(-1)).sum() / p_w.sum()
        p_loss.backward()
        r["packed"] = dict(tokens=p_idx, targets=p_tgt, weights=p_w, positions=p_pos, segments=p_seg,
                           logits=p_logits.detach(), loss=p_loss.item(), grads=grads_of(P))
        with torch.no_grad():  # both the document mask and the window bind in this batch
            a_doc = attention_mask(T, p_seg, 0); a_both = attention_mask(T, p_seg, c["window"])
            assert (a_doc & ~a_both).any() and (attention_mask(T, p_seg * 0, 0) & ~a_doc).any()
            lw, _ = forward(dict(c, window=0), {k: v.double() for k, v in init.items()}, p_idx, p_pos, p_seg)
            assert (lw - p_logits.detach()).abs().max().item() > 1e-2 * p_logits.abs().max().item()
    results[fam] = r

# ------------------------------------------------------------------------------------------------ writing
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "families_parity.h5")


def put(g, name, a):
    # one chunk per dataset: h5py's automatic chunking splits the larger ones and compresses them worse
    kw = dict(chunks=a.shape, compression="gzip", compression_opts=9, shuffle=True) if a.size > 64 else {}
    g.create_dataset(name, data=a, track_times=False, **kw)


def f32(t): return t.detach().numpy().astype(np.float32)
def i32(t): return t.numpy().astype(np.int32)


# No object timestamps anywhere (file, groups, datasets), so every run writes the same bytes.
fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE); fcpl.set_obj_track_times(False)
gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE); gcpl.set_obj_track_times(False)


def group(parent, name):
    return h5py.Group(h5py.h5g.create(parent.id, name.encode(), gcpl=gcpl))


with h5py.File(h5py.h5f.create(path.encode(), h5py.h5f.ACC_TRUNC, fcpl=fcpl, fapl=fapl)) as f:
    for fam, r in results.items():
        g = group(f, fam)
        for k, v in r["cfg"].items():
            g.attrs[k] = np.bytes_(v) if isinstance(v, str) else np.float64(v) if isinstance(v, float) \
                else np.int64(v)
        gi, gg = group(g, "init"), group(g, "grad")
        for k in r["init"]:
            put(gi, k, r["init"][k].numpy()); put(gg, k, f32(r["grads"][k]))
        put(g, "tokens", i32(r["tokens"])); put(g, "targets", i32(r["targets"]))
        put(g, "logits", f32(r["logits"]))
        put(g, "loss", np.array([r["loss"]], dtype=np.float64))
        put(g, "loss_lm", np.array([r["loss_lm"]], dtype=np.float64))
        put(g, "rope_inv_freq", r["inv_freq"].numpy().astype(np.float64))
        if r["cfg"]["experts"]:
            put(g, "router_aux", np.array(r["aux"], dtype=np.float64))
            put(g, "router_z", np.array(r["z"], dtype=np.float64))
            gr = group(g, "routing")
            for i, e in enumerate(r["expert_index"]): put(gr, f"blocks.{i}.expert_index", i32(e))
        if "packed" in r:
            p, gp = r["packed"], group(g, "packed")
            for k in ("tokens", "targets", "positions", "segments"): put(gp, k, i32(p[k]))
            put(gp, "weights", f32(p["weights"])); put(gp, "logits", f32(p["logits"]))
            put(gp, "loss", np.array([p["loss"]], dtype=np.float64))
            gpg = group(gp, "grad")
            for k in p["grads"]: put(gpg, k, f32(p["grads"][k]))

print(f"wrote {path} ({os.path.getsize(path)} bytes)")
for fam, r in results.items():
    line = (f"  {fam:9s} loss {r['loss']:.6f} (lm {r['loss_lm']:.6f}), max |logit| "
            f"{r['logits'].abs().max().item():.4f}, rotary moves logits by {r['rope_effect']:.3g} of max")
    if r["aux"]: line += f", aux {[round(a, 6) for a in r['aux']]}, z {[round(z, 6) for z in r['z']]}"
    if "rope_categories" in r: line += f", llama3 frequencies {r['rope_categories']}"
    if "window_effect" in r: line += f", window moves logits by {r['window_effect']:.3g} of max"
    if "packed" in r: line += f", packed loss {r['packed']['loss']:.6f}"
    print(line)
