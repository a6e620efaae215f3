#!/usr/bin/python3
"""Tiny models in the Hugging Face layout, their loss on a forge verification batch, and hostile files:
the reference side of test/ckpt/hf_test.sh (forge-ckpt import / export --format hf).

Neither transformers nor safetensors is used: the safetensors format is written and read here (an 8-byte
little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}
padded with spaces to 8 bytes, then the raw little-endian tensor bytes; BF16 through torch's bfloat16 seen
as int16), and the models are computed in float64 by test/trainer/reference/make_families.py's forward()
(llama, qwen2, qwen3, mistral, mixtral, qwen2_moe: the Hugging Face modeling code written out in PyTorch,
which the C++ trainer is checked against) after renaming the published tensors to its names; GPT-2 (learned
positions, LayerNorm with bias, fused c_attn, Conv1D weights stored [in, out], GELU's tanh form, tied
classifier) is written out below after transformers' modeling_gpt2. LLaVA (LlavaForConditionalGeneration: a
SigLIP vision transformer whose last block feeds a two-layer tanh-GELU projector, the pictures' features in
place of their placeholder tokens' embeddings in a Llama model) is make_vision.py's vision_features in front
of make_families' forward.

Subcommands (run with Debian's /usr/bin/python3, python3-torch and numpy):

  write --family F --dtype f32|bf16 [--shards N] --vocab V --out DIR [--seed S] [--tokenizer] [--legacy-names] [--new-names]
      A tiny random model of family F (llama qwen2 qwen3 mistral mixtral qwen2_moe gpt2 llava): config.json with
      the keys its transformers class reads, generation_config.json, model.safetensors or N shards
      model-0000k-of-0000N.safetensors with model.safetensors.index.json (weight_map, metadata.total_size).
      Shapes are make_families.FAMILIES' (2 layers, d_model 32, 4 query heads sharing 2 key/value heads of
      8, or 16 for qwen3) with vocabulary V; weights from make_families.draw_params (float32, sane scales),
      stored as F32 or rounded to BF16. --tokenizer: also a word-level tokenizer's files. --legacy-names
      (gpt2): the hub's gpt2 naming, without "transformer." and with the h.N.attn.bias mask buffers.
      --new-names (llava): the names transformers >= 4.52 saves (model.language_model., model.vision_tower., lm_head.), not the
      older language_model.model. ones. A llava model is the llama one with LLAVA_VISION's SigLIP tower
      (whose post_layernorm, which LLaVA does not use, is written too) and projector.

  loss --dir DIR --batch verify-batch.bin [--positions-from-batch] [--verbose]
      Reads a model directory (single file or sharded; F32, BF16, F16) and a serialized forge::MicroBatch
      (forge/common/batch.h), prints the loss the model gives on it, computed in float64 from the stored
      weights, as forge defines a checkpoint's verification loss (RunCheckpoints::meta: trainer.loss_of of
      the step's first micro-batch, ParallelTrainer::loss_of + LmCrossEntropy):

          loss = sum_i w_i * CE(logits_i, target_i) / sum_i w_i

      over every position i of every row, w_i = the batch's loss weight (1 when it has none) and 0 where the
      target is -1 (MicroBatch::weight). The MoE router's load-balancing (aux) and z losses are NOT part of
      it: they enter the gradients only (trainer/src/moe.cpp), and GPT::run_forward's LossSums hold the
      classifier's cross-entropy alone. Attention is causal (and within the sliding window); by default the
      positions are 0..T-1 in each row and a row is one document, as a Hugging Face forward(input_ids) sees
      it. --positions-from-batch takes the batch's positions and document ids (attention kept inside each
      document), which is what forge computes on a batch of packed documents; without it such a batch is
      still scored the Hugging Face way, with a warning.

  hostile --out DIR --case C|all
      A model directory with one defect (a tiny llama, or the file it would hold), for the import's refusal
      tests. Prints one line per case: "CASE<TAB>EXIT<TAB>PATTERN[<TAB>PATTERN...]": the exit status the
      import must give and extended regular expressions its message must match (the file, tensor or key).
      With --case all, every case in DIR/<case>.

  compare-hf A B [--convert DTYPE] [--shards-of BYTES]
                              A and B hold the same tensors (names, dtypes, shapes, bytes; compared by name,
                              whatever order their headers and shards have; --convert: A's rounded to DTYPE),
                              equivalent config.json files (the keys that change the model, and the token
                              ids) and the same generation and tokenizer files; --shards-of: B is shards of
                              at most BYTES of tensors with a consistent index. Exit 1 naming what differs.
  model-config CKPT DIR       the checkpoint's model record (manifest.json model_config) is the model DIR's
                              config.json describes (as read here; float32 keys as float32).
  same-params A.h5 B.h5       two `forge-ckpt export --params-only` files hold bit-identical /param tensors.
  batch                       runs the subcommands given one per line on stdin in one process (torch is
                              imported once), printing each one's output in turn.
"""
import argparse, json, math, os, re, shlex, struct, sys, types

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES_PY = os.path.normpath(os.path.join(HERE, "..", "..", "trainer", "reference", "make_families.py"))
VISION_PY = os.path.join(os.path.dirname(FAMILIES_PY), "make_vision.py")
FAMILY_NAMES = ["llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen2_moe", "gpt2", "llava"]
LLAVA = "LlavaForConditionalGeneration"
# The tower of the llava test model: 8 x 8 pictures in 4-pixel patches (4 positions each), SigLIP's epsilon.
LLAVA_VISION = dict(vision_layers=2, image_size=8, patch=4, vision_width=24, vision_heads=2, vision_mlp_hidden=48,
                    vision_norm_eps=1e-6)
LLAVA_SEED = 20261207
ARCH = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2"),
        "qwen3": ("Qwen3ForCausalLM", "qwen3"), "mistral": ("MistralForCausalLM", "mistral"),
        "mixtral": ("MixtralForCausalLM", "mixtral"), "qwen2_moe": ("Qwen2MoeForCausalLM", "qwen2_moe"),
        "gpt2": ("GPT2LMHeadModel", "gpt2")}
FAMILY_OF_ARCH = {a: f for f, (a, _) in ARCH.items()}
FAMILY_OF_TYPE = {t: f for f, (_, t) in ARCH.items()}
ROPE_POSITIONS = 1024    # max_position_embeddings of the rotary families
GPT2_POSITIONS = 64      # n_positions: rows of GPT-2's learned table
GPT2_SEED = 20240727
DTYPE_SIZE = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
              "BOOL": 1}


class Bad(Exception):
    """A model directory this reference cannot read (its message names the file and what is wrong)."""


# --------------------------------------------------------------------------------------- make_families
_mf = None


def mf():
    """test/trainer/reference/make_families.py as a module. It has no __main__ guard: importing it would
    compute every family and rewrite families_parity.h5 in the source tree, so unless it gains one, only its
    definitions (everything before the per-family loop, "results = {}") are executed, from its own file."""
    global _mf
    if _mf is None:
        src = open(FAMILIES_PY).read()
        if re.search(r"^if __name__ == [\"']__main__[\"']", src, re.M):
            sys.path.insert(0, os.path.dirname(FAMILIES_PY))
            import make_families as m
        else:
            cut = src.find("\nresults = {}")
            if cut < 0:
                raise SystemExit(f"{FAMILIES_PY}: no 'results = {{}}' line to stop at; update hf_models.mf()")
            m = types.ModuleType("make_families")
            m.__file__ = FAMILIES_PY
            exec(compile(src[:cut], FAMILIES_PY, "exec"), m.__dict__)
        _mf = m
    return _mf


def torch_mod():
    import torch
    return torch


_mv = None


def mv():
    """test/trainer/reference/make_vision.py as a module (it runs only under __main__)."""
    global _mv
    if _mv is None:
        sys.path.insert(0, os.path.dirname(VISION_PY))
        import make_vision
        _mv = make_vision
    return _mv


# ------------------------------------------------------------------------------------------ safetensors
def st_header(path):
    """(header dict, data start, file size) of a safetensors file, checked: the header inside the file,
    JSON, every tensor a known dtype whose shape fills its byte range, ranges inside the data and disjoint,
    and every data byte covered (as the format's reference implementation requires)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise Bad(f"{path}: shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise Bad(f"{path}: header length {n} is past the end of the file ({size} bytes)")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise Bad(f"{path}: the header is not JSON: {e}")
    if not isinstance(header, dict):
        raise Bad(f"{path}: the header is not a JSON object")
    start = 8 + n
    ranges = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t.get("dtype") not in DTYPE_SIZE:
            raise Bad(f"{path}: tensor '{name}': dtype {t.get('dtype')!r} is not known")
        shape, (b, e) = t["shape"], t["data_offsets"]
        count = 1
        for d in shape:
            count *= d
        if count * DTYPE_SIZE[t["dtype"]] != e - b or b > e:
            raise Bad(f"{path}: tensor '{name}': {t['dtype']} {shape} does not fill bytes [{b}, {e})")
        if e > size - start:
            raise Bad(f"{path}: tensor '{name}': bytes [{b}, {e}) are past the end of the data")
        ranges.append((b, e, name))
    at = 0
    for b, e, name in sorted(ranges):
        if b != at:
            raise Bad(f"{path}: tensor '{name}' starts at byte {b}, the tensors before end at {at}")
        at = e
    if at != size - start:
        raise Bad(f"{path}: the tensors end at data byte {at}, the file at {size - start}")
    return header, start, size


def st_read_raw(path):
    """name -> (dtype, shape, bytes) of every tensor of a safetensors file (checked as st_header)."""
    header, start, _ = st_header(path)
    out = {}
    with open(path, "rb") as f:
        for name, t in header.items():
            if name == "__metadata__":
                continue
            b, e = t["data_offsets"]
            f.seek(start + b)
            out[name] = (t["dtype"], list(t["shape"]), f.read(e - b))
    return out


def st_write(path, tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes), stored in that order."""
    header, at = {"__metadata__": metadata or {"format": "pt"}}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(data)]}
        at += len(data)
    write_raw_st(path, header, b"".join(t[3] for t in tensors))


def write_raw_st(path, header, data, header_len=None):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text) if header_len is None else header_len) + text + data)


def model_files(d):
    """The safetensors files of a model directory and the tensor -> file map: the index's when there is
    one (every file it names present, every tensor where it says), else model.safetensors."""
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            wm = json.load(open(index))["weight_map"]
        except (ValueError, KeyError) as e:
            raise Bad(f"{index}: no weight_map: {e}")
        files = sorted(set(wm.values()))
        for f in files:
            if not os.path.exists(os.path.join(d, f)):
                raise Bad(f"{index} names {f}, which is missing")
        return files, wm
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        raise Bad(f"{d}: neither model.safetensors nor model.safetensors.index.json")
    return ["model.safetensors"], None


def read_raw_dir(d):
    """name -> (dtype, shape, bytes, file) of every tensor of a model directory."""
    files, wm = model_files(d)
    out = {}
    for fn in files:
        for name, (dt, shape, data) in st_read_raw(os.path.join(d, fn)).items():
            if name in out:
                raise Bad(f"{d}: tensor '{name}' is in {out[name][3]} and {fn}")
            if wm is not None and wm.get(name) != fn:
                raise Bad(f"{d}: tensor '{name}' is in {fn}, the index says {wm.get(name)}")
            out[name] = (dt, shape, data, fn)
    if wm is not None:
        for name, fn in wm.items():
            if name not in out:
                raise Bad(f"{d}: the index maps '{name}' to {fn}, which does not hold it")
    return out


def to_bytes(t, dtype):
    """A float tensor as little-endian dtype bytes (F32 or BF16, rounding to nearest even)."""
    torch = torch_mod()
    if dtype == "F32":
        return t.to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
    if dtype == "BF16":
        return t.to(torch.float32).to(torch.bfloat16).contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
    if dtype == "F16":
        return t.to(torch.float16).contiguous().numpy().astype("<f2").tobytes()
    raise ValueError(dtype)


def from_bytes(dtype, shape, data):
    """float64 tensor of stored bytes (exact for F32, BF16, F16)."""
    torch = torch_mod()
    import numpy as np
    if dtype == "F32":
        a = torch.from_numpy(np.frombuffer(data, dtype="<f4").copy())
    elif dtype == "BF16":
        a = torch.from_numpy(np.frombuffer(data, dtype="<i2").copy()).view(torch.bfloat16)
    elif dtype == "F16":
        a = torch.from_numpy(np.frombuffer(data, dtype="<f2").copy())
    elif dtype == "F64":
        a = torch.from_numpy(np.frombuffer(data, dtype="<f8").copy())
    else:
        raise Bad(f"dtype {dtype} is not a float type")
    return a.to(torch.float64).reshape(shape)


# --------------------------------------------------------------------------------------- configurations
def family_config(fam, vocab):
    """make_families' configuration of a family (its FAMILIES shapes) with vocabulary `vocab`; GPT-2's and
    LLaVA's (the llama one with LLAVA_VISION) are written here."""
    if fam == "llava":
        c = family_config("llama", vocab)
        c["vision"] = dict(LLAVA_VISION)
        c["image_token_index"] = vocab - 3
        return c
    if fam == "gpt2":
        return dict(family="gpt2", layers=2, d_model=32, heads=4, kv_heads=4, head_dim=8, vocab=vocab,
                    positions=GPT2_POSITIONS, ffn_hidden=128, norm_eps=1e-5, tied_embeddings=1)
    m = mf()
    c = dict(m.COMMON, **m.FAMILIES[fam], family=fam)
    c["vocab"] = vocab
    return c


def hf_config(fam, c, dtype):
    """config.json of the family's transformers class for configuration c."""
    if fam == "llava":
        text = hf_config("llama", {k: v for k, v in c.items() if k != "vision"}, dtype)
        del text["architectures"]
        v = c["vision"]
        vision = {"model_type": "siglip_vision_model", "hidden_size": v["vision_width"],
                  "intermediate_size": v["vision_mlp_hidden"], "num_hidden_layers": v["vision_layers"],
                  "num_attention_heads": v["vision_heads"], "num_channels": 3, "image_size": v["image_size"],
                  "patch_size": v["patch"], "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": v["vision_norm_eps"],
                  "attention_dropout": 0.0, "vision_use_head": False}
        return {"architectures": [LLAVA], "model_type": "llava", "text_config": text, "vision_config": vision,
                "image_token_index": c["image_token_index"], "projector_hidden_act": "gelu_pytorch_tanh",
                "vision_feature_layer": -1, "vision_feature_select_strategy": "full",
                "image_seq_length": (v["image_size"] // v["patch"]) ** 2, "multimodal_projector_bias": True,
                "tie_word_embeddings": bool(c["tied_embeddings"]), "torch_dtype": text["torch_dtype"],
                "transformers_version": text["transformers_version"]}
    arch, mt = ARCH[fam]
    torch_dtype = {"f32": "float32", "bf16": "bfloat16"}[dtype]
    if fam == "gpt2":
        V = c["vocab"]
        return {"architectures": [arch], "model_type": mt, "activation_function": "gelu_new",
                "attn_pdrop": 0.1, "bos_token_id": V - 1, "eos_token_id": V - 1, "embd_pdrop": 0.1,
                "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "n_ctx": c["positions"],
                "n_embd": c["d_model"], "n_head": c["heads"], "n_inner": None, "n_layer": c["layers"],
                "n_positions": c["positions"], "reorder_and_upcast_attn": False, "resid_pdrop": 0.1,
                "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
                "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
                "summary_type": "cls_index", "summary_use_proj": True, "tie_word_embeddings": True,
                "torch_dtype": torch_dtype, "transformers_version": "4.51.3", "use_cache": True,
                "vocab_size": V}
    L = c["layers"]
    cfg = {"architectures": [arch], "model_type": mt, "attention_dropout": 0.0, "bos_token_id": 1,
           "eos_token_id": 2, "head_dim": c["head_dim"], "hidden_act": "silu", "hidden_size": c["d_model"],
           "initializer_range": 0.02, "intermediate_size": c["ffn_hidden"] or 96,
           "max_position_embeddings": ROPE_POSITIONS, "num_attention_heads": c["heads"],
           "num_hidden_layers": L, "num_key_value_heads": c["kv_heads"], "rms_norm_eps": c["norm_eps"],
           "rope_scaling": None, "rope_theta": c["rope_theta"],
           "tie_word_embeddings": bool(c["tied_embeddings"]), "torch_dtype": torch_dtype,
           "transformers_version": "4.51.3", "use_cache": True, "vocab_size": c["vocab"]}
    if fam == "llama":
        cfg.update(attention_bias=False, mlp_bias=False, pretraining_tp=1,
                   rope_scaling={"factor": c["rope_factor"], "high_freq_factor": c["rope_high_freq_factor"],
                                 "low_freq_factor": c["rope_low_freq_factor"],
                                 "original_max_position_embeddings": c["rope_original_positions"],
                                 "rope_type": "llama3"})
    elif fam in ("qwen2", "qwen3", "qwen2_moe"):
        # A window the layers do not use (use_sliding_window false), as Qwen's published configs have.
        cfg.update(use_sliding_window=False, sliding_window=4096, max_window_layers=L)
        if fam == "qwen3":
            cfg["attention_bias"] = False
    elif fam == "mistral":
        cfg["sliding_window"] = c["window"]
    if fam == "mixtral":
        cfg.update(intermediate_size=c["moe_hidden"], num_local_experts=c["experts"],
                   num_experts_per_tok=c["top_k"], output_router_logits=False, router_aux_loss_coef=0.02,
                   router_jitter_noise=0.0, sliding_window=None)
    if fam == "qwen2_moe":
        cfg.update(num_experts=c["experts"], num_experts_per_tok=c["top_k"], moe_intermediate_size=c["moe_hidden"],
                   shared_expert_intermediate_size=c["shared_expert_hidden"], decoder_sparse_step=1,
                   norm_topk_prob=bool(c["router_renormalize"]), mlp_only_layers=[], output_router_logits=False,
                   router_aux_loss_coef=0.001)
    return cfg


def read_config(d):
    path = os.path.join(d, "config.json")
    try:
        # NaN / Infinity are not JSON: refuse them as the C++ parser does
        return json.load(open(path), parse_constant=lambda s: (_ for _ in ()).throw(ValueError(s)))
    except (OSError, ValueError) as e:
        raise Bad(f"{path}: {e}")


def config_model(cfg, where="config.json"):
    """The configuration make_families.forward (or gpt2_forward) computes with, read from config.json the
    way the transformers class reads it (its defaults for absent keys); Bad for what this reference does
    not compute."""
    if (cfg.get("architectures") or [None])[0] == LLAVA or cfg.get("model_type") == "llava":
        return llava_config_model(cfg, where)
    if cfg.get("architectures"):
        arch = cfg["architectures"][0]
        if arch not in FAMILY_OF_ARCH:
            raise Bad(f"{where}: architectures {arch}: not one of {sorted(FAMILY_OF_ARCH)}")
        fam = FAMILY_OF_ARCH[arch]
    else:
        fam = FAMILY_OF_TYPE.get(cfg.get("model_type"))
        if fam is None:
            raise Bad(f"{where}: model_type {cfg.get('model_type')!r} is not known")
    g = lambda k, default=None: default if cfg.get(k) is None else cfg[k]
    if fam == "gpt2":
        d = g("n_embd", 768)
        if g("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
            raise Bad(f"{where}: activation_function {cfg['activation_function']}")
        if not g("scale_attn_weights", True) or g("scale_attn_by_inverse_layer_idx", False):
            raise Bad(f"{where}: attention scaling other than 1/sqrt(head_dim)")
        return dict(family="gpt2", layers=g("n_layer", 12), d_model=d, heads=g("n_head", 12),
                    kv_heads=g("n_head", 12), head_dim=d // g("n_head", 12), vocab=g("vocab_size", 50257),
                    positions=g("n_positions", 1024), ffn_hidden=g("n_inner", 4 * d),
                    norm_eps=float(g("layer_norm_epsilon", 1e-5)),
                    tied_embeddings=int(g("tie_word_embeddings", True)))
    m = mf()
    c = dict(m.COMMON, family=fam)
    C, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    c.update(layers=cfg["num_hidden_layers"], d_model=C, heads=NH, kv_heads=g("num_key_value_heads", NH),
             head_dim=g("head_dim", C // NH), vocab=cfg["vocab_size"],
             positions=g("max_position_embeddings", 0),
             norm_eps=float(g("rms_norm_eps", 1e-5 if fam == "mixtral" else 1e-6)),
             rope_theta=float(g("rope_theta", 1e6 if fam == "mixtral" else 1e4)),
             tied_embeddings=int(g("tie_word_embeddings", False)), ffn_hidden=g("intermediate_size", 0))
    if g("hidden_act", "silu") != "silu":
        raise Bad(f"{where}: hidden_act {cfg['hidden_act']}")
    rs = cfg.get("rope_scaling")
    if rs:
        kind = rs.get("rope_type", rs.get("type", "default"))
        if kind == "llama3":
            c.update(rope_scaling="llama3", rope_factor=float(rs["factor"]),
                     rope_low_freq_factor=float(rs["low_freq_factor"]),
                     rope_high_freq_factor=float(rs["high_freq_factor"]),
                     rope_original_positions=rs["original_max_position_embeddings"])
        elif kind != "default":
            raise Bad(f"{where}: rope_scaling type {kind} is not computed here")
    if fam in ("qwen2", "qwen2_moe"):
        c["qkv_bias"] = 1
    elif g("attention_bias", False):
        raise Bad(f"{where}: attention_bias")
    if g("mlp_bias", False):
        raise Bad(f"{where}: mlp_bias")
    c["qk_norm"] = int(fam == "qwen3")
    window = 0
    if fam in ("mistral", "mixtral"):
        window = g("sliding_window", 0)
    elif g("use_sliding_window", False) and g("sliding_window"):
        mwl = g("max_window_layers", c["layers"])
        if mwl == 0:
            window = cfg["sliding_window"]
        elif mwl < c["layers"]:
            raise Bad(f"{where}: a sliding window on some layers only")
    c["window"] = window
    if fam == "mixtral":
        c.update(experts=g("num_local_experts", 8), top_k=g("num_experts_per_tok", 2),
                 moe_hidden=cfg["intermediate_size"], router_renormalize=1, shared_expert_hidden=0, ffn_hidden=0)
        if g("router_jitter_noise", 0.0):
            raise Bad(f"{where}: router_jitter_noise")
    elif fam == "qwen2_moe":
        if g("decoder_sparse_step", 1) != 1 or g("mlp_only_layers", []):
            raise Bad(f"{where}: dense layers between MoE layers are not computed here")
        c.update(experts=g("num_experts", 60), top_k=g("num_experts_per_tok", 4),
                 moe_hidden=g("moe_intermediate_size", 1408),
                 shared_expert_hidden=g("shared_expert_intermediate_size", 5632),
                 router_renormalize=int(g("norm_topk_prob", False)), ffn_hidden=0)
    return c


def llava_config_model(cfg, where):
    """A LLaVA config: its text model's configuration with c["vision"] (make_vision's keys) added."""
    g = lambda d, k, default=None: default if d.get(k) is None else d[k]
    text, vc = cfg.get("text_config"), cfg.get("vision_config")
    if not isinstance(text, dict) or not isinstance(vc, dict):
        raise Bad(f"{where}: a LLaVA config needs text_config and vision_config objects")
    text = dict(text)
    text.setdefault("architectures", [ARCH[FAMILY_OF_TYPE.get(text.get("model_type"), "llama")][0]])
    c = config_model(text, where + ": text_config")
    checks = [(vc.get("model_type"), "siglip_vision_model", "vision_config.model_type"),
              (g(vc, "hidden_act", "gelu_pytorch_tanh"), "gelu_pytorch_tanh", "vision_config.hidden_act"),
              (g(cfg, "projector_hidden_act", "gelu"), "gelu_pytorch_tanh", "projector_hidden_act"),
              (g(cfg, "vision_feature_layer", -2), -1, "vision_feature_layer"),
              (g(cfg, "vision_feature_select_strategy", "default"), "full", "vision_feature_select_strategy"),
              (g(cfg, "multimodal_projector_bias", True), True, "multimodal_projector_bias")]
    for have, want, key in checks:
        if have != want:
            raise Bad(f"{where}: {key} {have!r} is not computed here (only {want!r})")
    c["vision"] = dict(vision_layers=g(vc, "num_hidden_layers", 12), image_size=g(vc, "image_size", 224),
                       patch=g(vc, "patch_size", 16), vision_width=g(vc, "hidden_size", 768),
                       vision_heads=g(vc, "num_attention_heads", 12),
                       vision_mlp_hidden=g(vc, "intermediate_size", 3072),
                       vision_norm_eps=float(g(vc, "layer_norm_eps", 1e-6)))
    c["image_token_index"] = g(cfg, "image_token_index", 32000)
    return c


# --------------------------------------------------------------------------------- tensor name mapping
def llava_vision_shapes(c):
    """forge's vision tower and projector parameters (without vision.ln_post: LLaVA reads the last block)."""
    v, C = c["vision"], c["d_model"]
    W, H, k = v["vision_width"], v["vision_mlp_hidden"], v["patch"]
    s = {"vision.patch.weight": (W, 3 * k * k), "vision.patch.bias": (W,),
         "vision.pos.weight": ((v["image_size"] // k) ** 2, W)}
    for i in range(v["vision_layers"]):
        b = f"vision.blocks.{i}."
        s.update({b + "ln1.weight": (W,), b + "ln1.bias": (W,), b + "attn.qkv.weight": (3 * W, W),
                  b + "attn.qkv.bias": (3 * W,), b + "attn.proj.weight": (W, W), b + "attn.proj.bias": (W,),
                  b + "ln2.weight": (W,), b + "ln2.bias": (W,), b + "mlp.fc.weight": (H, W),
                  b + "mlp.fc.bias": (H,), b + "mlp.proj.weight": (W, H), b + "mlp.proj.bias": (W,)})
    s.update({"projector.fc1.weight": (C, W), "projector.fc1.bias": (C,), "projector.fc2.weight": (C, C),
              "projector.fc2.bias": (C,)})
    return s


def llava_canonical(name):
    """A LLaVA tensor's name in the layout of transformers before 4.52 (which hf_layout spells)."""
    for new, old in (("model.language_model.", "language_model.model."), ("model.vision_tower.", "vision_tower."),
                     ("model.multi_modal_projector.", "multi_modal_projector."), ("lm_head.", "language_model.lm_head.")):
        if name.startswith(new):
            return old + name[len(new):]
    return name


LLAVA_UNUSED = ("vision_tower.vision_model.post_layernorm.", "vision_tower.vision_model.head.")


def tower_layout(v, e):
    """hf_layout's rows of a SigLIP tower whose tensor names start with e (without its final norm)."""
    W = v["vision_width"]
    out = [(e + "embeddings.patch_embedding.weight", "vision.patch.weight", None, 0, None),
           (e + "embeddings.patch_embedding.bias", "vision.patch.bias", None, 0, None),
           (e + "embeddings.position_embedding.weight", "vision.pos.weight", None, 0, None)]
    for i in range(v["vision_layers"]):
        h, b = f"{e}encoder.layers.{i}.", f"vision.blocks.{i}."
        out += [(h + "layer_norm1.weight", b + "ln1.weight", None, 0, None),
                (h + "layer_norm1.bias", b + "ln1.bias", None, 0, None)]
        for j, x in enumerate("qkv"):
            out += [(h + f"self_attn.{x}_proj.weight", b + "attn.qkv.weight", None, j * W, W),
                    (h + f"self_attn.{x}_proj.bias", b + "attn.qkv.bias", None, j * W, W)]
        for hf, fp in (("self_attn.out_proj", "attn.proj"), ("layer_norm2", "ln2"), ("mlp.fc1", "mlp.fc"),
                       ("mlp.fc2", "mlp.proj")):
            out += [(h + hf + ".weight", b + fp + ".weight", None, 0, None),
                    (h + hf + ".bias", b + fp + ".bias", None, 0, None)]
    return out


def hf_layout(c):
    """Every published tensor of a (non-GPT-2) model: (hf name, forge name, expert or None, first row,
    rows or None). A None rows means the whole forge parameter (or the whole expert's matrix)."""
    if "vision" in c:  # LLaVA: the SigLIP tower, the projector, the language model under language_model.
        text = {k: v for k, v in c.items() if k != "vision"}
        out = tower_layout(c["vision"], "vision_tower.vision_model.")
        for hf, fp in (("linear_1", "fc1"), ("linear_2", "fc2")):
            for x in ("weight", "bias"):
                out.append((f"multi_modal_projector.{hf}.{x}", f"projector.{fp}.{x}", None, 0, None))
        return out + [("language_model." + hf, *rest) for hf, *rest in hf_layout(text)]
    out = [("model.embed_tokens.weight", "wte.weight", None, 0, None)]
    for i in range(c["layers"]):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        out.append((h + "input_layernorm.weight", b + "ln1.weight", None, 0, None))
        for x in "qkv":
            out.append((h + f"self_attn.{x}_proj.weight", b + f"attn.{x}.weight", None, 0, None))
            if c["qkv_bias"]:
                out.append((h + f"self_attn.{x}_proj.bias", b + f"attn.{x}.bias", None, 0, None))
        if c["qk_norm"]:
            out.append((h + "self_attn.q_norm.weight", b + "attn.q_norm.weight", None, 0, None))
            out.append((h + "self_attn.k_norm.weight", b + "attn.k_norm.weight", None, 0, None))
        out.append((h + "self_attn.o_proj.weight", b + "attn.proj.weight", None, 0, None))
        out.append((h + "post_attention_layernorm.weight", b + "ln2.weight", None, 0, None))

        def swiglu(hp, fp, e, H, gate, up, down, down_param):
            out.append((hp + gate + ".weight", fp + "gate_up.weight", e, 0, H))
            out.append((hp + up + ".weight", fp + "gate_up.weight", e, H, H))
            out.append((hp + down + ".weight", down_param, e, 0, None))

        if c["experts"] == 0:
            swiglu(h + "mlp.", b + "mlp.", None, c["ffn_hidden"], "gate_proj", "up_proj", "down_proj",
                   b + "mlp.down.weight")
        elif c["family"] == "mixtral":
            out.append((h + "block_sparse_moe.gate.weight", b + "moe.router.weight", None, 0, None))
            for e in range(c["experts"]):
                swiglu(f"{h}block_sparse_moe.experts.{e}.", b + "moe.", e, c["moe_hidden"], "w1", "w3", "w2",
                       b + "moe.down.weight")
        else:
            out.append((h + "mlp.gate.weight", b + "moe.router.weight", None, 0, None))
            for e in range(c["experts"]):
                swiglu(f"{h}mlp.experts.{e}.", b + "moe.", e, c["moe_hidden"], "gate_proj", "up_proj",
                       "down_proj", b + "moe.down.weight")
            if c["shared_expert_hidden"]:
                swiglu(h + "mlp.shared_expert.", b + "moe.shared.", None, c["shared_expert_hidden"], "gate_proj",
                       "up_proj", "down_proj", b + "moe.shared.down.weight")
                out.append((h + "mlp.shared_expert_gate.weight", b + "moe.shared_gate.weight", None, 0, None))
    out.append(("model.norm.weight", "lnf.weight", None, 0, None))
    if not c["tied_embeddings"]:
        out.append(("lm_head.weight", "head.weight", None, 0, None))
    return out


def _piece(t, e, r0, n):
    if e is not None:
        t = t[e]
    return t if n is None else t[r0:r0 + n]


def _published_shape(c, hf, t):
    """The patch embedding is published as the convolution's [W, 3, p, p]; forge holds it [W, 3 p p]."""
    if hf.endswith("patch_embedding.weight"):
        k = c["vision"]["patch"]
        return t.reshape(t.shape[0], 3, k, k)
    return t


def forge_to_hf(c, P):
    return {hf: _published_shape(c, hf, _piece(P[fp], e, r0, n)).clone() for hf, fp, e, r0, n in hf_layout(c)}


def hf_to_forge(c, T, where):
    """forge-named float64 parameters from published tensors (every one placed once, shapes checked)."""
    torch = torch_mod()
    shapes = mf().param_shapes(c)
    if "vision" in c:
        shapes.update(llava_vision_shapes(c))
        T = {llava_canonical(k): v for k, v in T.items() if not llava_canonical(k).startswith(LLAVA_UNUSED)}
    P = {k: torch.full(s, float("nan"), dtype=torch.float64) for k, s in shapes.items()}
    layout = hf_layout(c)
    want = {hf for hf, *_ in layout}
    head = "language_model.lm_head.weight" if "vision" in c else "lm_head.weight"
    extra = sorted(set(T) - want - ({head} if c["tied_embeddings"] else set()))
    if extra:
        raise Bad(f"{where}: tensors this config.json has no place for: {extra[:5]}")
    for hf, fp, e, r0, n in layout:
        if hf not in T:
            raise Bad(f"{where}: tensor '{hf}' is missing")
        dst = _published_shape(c, hf, _piece(P[fp], e, r0, n))
        if tuple(dst.shape) != tuple(T[hf].shape):
            raise Bad(f"{where}: tensor '{hf}' has shape {list(T[hf].shape)}, expected {list(dst.shape)}")
        dst.copy_(T[hf])
    for k, p in P.items():
        assert not torch.isnan(p).any(), ("a forge parameter not covered", k)
    return P


def gpt2_shapes(c):
    C, V, L, H = c["d_model"], c["vocab"], c["layers"], c["ffn_hidden"]
    s = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (c["positions"], C)}
    for i in range(L):
        h = f"transformer.h.{i}."
        s.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "attn.c_attn.weight": (C, 3 * C),
                  h + "attn.c_attn.bias": (3 * C,), h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                  h + "ln_2.weight": (C,), h + "ln_2.bias": (C,), h + "mlp.c_fc.weight": (C, H),
                  h + "mlp.c_fc.bias": (H,), h + "mlp.c_proj.weight": (H, C), h + "mlp.c_proj.bias": (C,)})
    s.update({"transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)})
    return s


def gpt2_draw(c, gen):
    """float32 GPT-2 weights: matrices N(0, 0.02) (output projections 0.02 / sqrt(2 L), c_attn 0.2 so the
    attention is not uniform), embeddings N(0, 0.05), positions N(0, 0.05) (they visibly move the logits),
    LayerNorm weights 1 + 0.1 N(0, 1), biases 0.02 N(0, 1)."""
    torch = torch_mod()
    out, L = {}, c["layers"]
    for name, shape in gpt2_shapes(c).items():
        z = torch.randn(*shape, generator=gen, dtype=torch.float32)
        if name.endswith("bias"):
            w = 0.02 * z
        elif len(shape) == 1:
            w = 1 + 0.1 * z
        elif name.endswith(("wte.weight", "wpe.weight")):
            w = 0.05 * z
        elif name.endswith("c_attn.weight"):
            w = 0.2 * z
        elif name.endswith("c_proj.weight"):
            w = 0.02 / math.sqrt(2 * L) * z
        else:
            w = 0.02 * z
        out[name] = w
    return out


def gpt2_canonical(T):
    """Published GPT-2 tensors with the "transformer." prefix (the hub's older files lack it); the tied
    classifier's copy dropped."""
    out = {}
    for k, v in T.items():
        if k == "lm_head.weight" or k.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        out[k if k.startswith("transformer.") else "transformer." + k] = v
    return out


def gpt2_forward(c, T, idx, pos, seg):
    """transformers' GPT2LMHeadModel in float64 (eval: no dropout): logits [B, T, V]."""
    import torch.nn.functional as F
    B, Tn = idx.shape
    C, NH, eps = c["d_model"], c["heads"], c["norm_eps"]
    hd = C // NH
    allowed = mf().attention_mask(Tn, seg, 0)
    x = T["transformer.wte.weight"][idx] + T["transformer.wpe.weight"][pos]
    ln = lambda x, p: F.layer_norm(x, (C,), T[p + ".weight"], T[p + ".bias"], eps)
    for i in range(c["layers"]):
        h = f"transformer.h.{i}."
        a = ln(x, h + "ln_1")
        qkv = a @ T[h + "attn.c_attn.weight"] + T[h + "attn.c_attn.bias"]   # Conv1D: x @ W [in, out] + b
        q, k, v = (t.view(B, Tn, NH, hd).transpose(1, 2) for t in qkv.split(C, dim=-1))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~allowed, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, Tn, C)
        x = x + y @ T[h + "attn.c_proj.weight"] + T[h + "attn.c_proj.bias"]
        m = ln(x, h + "ln_2") @ T[h + "mlp.c_fc.weight"] + T[h + "mlp.c_fc.bias"]
        m = F.gelu(m, approximate="tanh")                                     # gelu_new
        x = x + m @ T[h + "mlp.c_proj.weight"] + T[h + "mlp.c_proj.bias"]
    return ln(x, "transformer.ln_f") @ T["transformer.wte.weight"].t()


# ------------------------------------------------------------------------------------------------- write
def publish(out, cfg, tensors, dtype, shards, order):
    """config.json, generation_config.json and the tensors (name -> float tensor) as model.safetensors or
    `shards` files of about equal bytes (in `order`, as transformers shards), with their index."""
    os.makedirs(out, exist_ok=True)
    st = {"f32": "F32", "bf16": "BF16"}[dtype]
    items = [(n, st, list(tensors[n].shape), to_bytes(tensors[n], st)) for n in order]
    total = sum(len(t[3]) for t in items)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    ids = cfg.get("text_config", cfg)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"_from_model_config": True, "bos_token_id": ids["bos_token_id"],
                   "eos_token_id": ids["eos_token_id"], "transformers_version": cfg["transformers_version"]},
                  f, indent=2)
        f.write("\n")
    if shards <= 1:
        st_write(os.path.join(out, "model.safetensors"), sorted(items))
        return
    groups, cur, acc = [], [], 0
    for it in items:  # close a shard once it holds its share of the bytes
        cur.append(it)
        acc += len(it[3])
        if acc >= total * (len(groups) + 1) / shards and len(groups) < shards - 1:
            groups.append(cur)
            cur = []
    groups.append(cur)
    groups = [g for g in groups if g]
    n = len(groups)
    weight_map = {}
    for k, g in enumerate(groups):
        fn = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        st_write(os.path.join(out, fn), sorted(g))
        weight_map.update({t[0]: fn for t in g})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f,
                  indent=2)
        f.write("\n")


def cmd_write(a):
    torch = torch_mod()
    fam = a.family
    c = family_config(fam, a.vocab)
    seed = a.seed if a.seed is not None else {"gpt2": GPT2_SEED, "llava": LLAVA_SEED}.get(fam) or mf().SEEDS[fam]
    gen = torch.Generator().manual_seed(seed)
    if fam == "gpt2":
        T = gpt2_draw(c, gen)
        if a.legacy_names:  # as the hub's gpt2 files: no "transformer.", the causal-mask buffers saved
            P = c["positions"]
            mask = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
            T = {k[len("transformer."):]: v for k, v in T.items()}
            for i in range(c["layers"]):
                T[f"h.{i}.attn.bias"] = mask
    elif fam == "llava":
        T = llava_draw(c, gen, a.new_names)
    else:
        T = forge_to_hf(c, mf().draw_params(c, gen))
    order = list(T)  # transformers' order: embeddings, layers in turn, final norm, classifier
    cfg = hf_config(fam, c, a.dtype)
    publish(a.out, cfg, T, a.dtype, a.shards, order)
    if a.tokenizer:
        write_tokenizer(a.out, c["vocab"], cfg)


def llava_draw(c, gen, new_names):
    """Published LLaVA tensors: make_families' llama weights, and a tower and projector drawn as
    make_vision.initial draws its own (q and k rows N(0, 0.25), patch embedding N(0, 0.1), projector
    N(0, 0.15): the pictures visibly move the logits), with a random post_layernorm LLaVA must not use."""
    torch = torch_mod()
    text = {k: v for k, v in c.items() if k != "vision"}
    P = mf().draw_params(text, gen)
    W = c["vision"]["vision_width"]
    for name, shape in llava_vision_shapes(c).items():
        n = torch.randn(shape, generator=gen, dtype=torch.float32)
        if "ln" in name and name.endswith(".weight"):
            w = 1 + 0.1 * n
        elif name.endswith(".bias"):
            w = 0.02 * n
        else:
            std = 0.1 if name.startswith("vision.patch") else 0.15 if name.startswith("projector.") else 0.02
            w = std * n
            if "attn.qkv.weight" in name:
                w[: 2 * W] = 0.25 * n[: 2 * W]
        P[name] = w
    T = forge_to_hf(c, P)
    e = "vision_tower.vision_model.post_layernorm."
    T[e + "weight"] = 1 + 0.1 * torch.randn(W, generator=gen)
    T[e + "bias"] = 0.02 * torch.randn(W, generator=gen)
    if new_names:
        T = {_new_name(n): t for n, t in T.items()}
    return T


def _new_name(name):
    """A LLaVA tensor's name as transformers >= 4.52 saves it."""
    for old, new in (("language_model.model.", "model.language_model."), ("vision_tower.", "model.vision_tower."),
                     ("multi_modal_projector.", "model.multi_modal_projector."), ("language_model.lm_head.", "lm_head.")):
        if name.startswith(old):
            return new + name[len(old):]
    return name


def write_tokenizer(out, V, cfg):
    """A word-level tokenizer of V tokens in transformers' files (tokenizer.json, tokenizer_config.json,
    special_tokens_map.json): what an import keeps and an export hands back unchanged."""
    ids = cfg.get("text_config", cfg)
    bos, eos = ids["bos_token_id"], ids["eos_token_id"]
    names = [f"w{i}" for i in range(V)]
    names[0] = "<unk>"
    names[bos], names[eos] = ("<|endoftext|>",) * 2 if bos == eos else ("<s>", "</s>")
    if "image_token_index" in cfg:
        names[cfg["image_token_index"]] = "<image>"
    added = [{"id": i, "content": names[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i in sorted({0, bos, eos} | ({cfg["image_token_index"]} if "image_token_index" in cfg else set()))]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
           "model": {"type": "WordLevel", "vocab": {n: i for i, n in enumerate(names)}, "unk_token": "<unk>"}}
    special = {"bos_token": names[bos], "eos_token": names[eos], "unk_token": "<unk>"}
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(dict(special, model_max_length=ids.get("max_position_embeddings", ids.get("n_positions")),
                       tokenizer_class="PreTrainedTokenizerFast", clean_up_tokenization_spaces=False), f, indent=2)
    with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=2)


# -------------------------------------------------------------------------------------------------- loss
def read_batch(path):
    """A serialized forge::MicroBatch (common/src/batch.cpp): magic FMBATCH1; rows, seq_len, flags (u32);
    inputs, targets (i32); weights (f32, flag 1), positions (i32, 2), segments (i32, 4); sample_ids (u64),
    epochs (u32) per row; reference log-probabilities (f64, 2 a row, flag 8); domains (u16 a row, 16);
    rollouts (flag 32: advantages f32 a row, old log-probabilities f32; flag 64: reference log-probabilities
    f32); pictures (flag 128: image_size, image_tokens, count (i64); count run starts (i64, row x seq_len +
    t); count x image_size^2 x 3 RGB bytes)."""
    import numpy as np
    data = open(path, "rb").read()
    if data[:8] != b"FMBATCH1":
        raise Bad(f"{path}: not a serialized micro-batch (bad magic)")
    rows, T, flags = struct.unpack_from("<3I", data, 8)
    at, n = 20, rows * T
    b = dict(rows=rows, seq_len=T)

    def take(name, dt, count):
        nonlocal at
        size = np.dtype(dt).itemsize * count
        if at + size > len(data):
            raise Bad(f"{path}: truncated at {name}")
        b[name] = np.frombuffer(data, dtype=dt, count=count, offset=at).copy()
        at += size

    take("inputs", "<i4", n)
    take("targets", "<i4", n)
    take("weights", "<f4", n if flags & 1 else 0)
    take("positions", "<i4", n if flags & 2 else 0)
    take("segments", "<i4", n if flags & 4 else 0)
    take("sample_ids", "<u8", rows)
    take("epochs", "<u4", rows)
    take("reference_logps", "<f8", 2 * rows if flags & 8 else 0)
    take("domains", "<u2", rows if flags & 16 else 0)
    take("advantages", "<f4", rows if flags & 32 else 0)
    take("old_logps", "<f4", n if flags & 32 else 0)
    take("ref_logps", "<f4", n if flags & 64 else 0)
    b["image_size"] = b["image_tokens"] = 0
    b["image_starts"], b["pictures"] = [], None
    if flags & 128:
        take("picture_header", "<i8", 3)
        b["image_size"], b["image_tokens"], count = (int(x) for x in b["picture_header"])
        take("image_starts", "<i8", count)
        take("pixels", "u1", count * b["image_size"] ** 2 * 3)
        b["pictures"] = b["pixels"].reshape(count, b["image_size"], b["image_size"], 3)
    if at != len(data):
        raise Bad(f"{path}: {len(data) - at} trailing bytes")
    return b


def read_model(d):
    """(configuration, float64 tensors by published name) of a model directory."""
    cfg = read_config(d)
    c = config_model(cfg, os.path.join(d, "config.json"))
    raw = read_raw_dir(d)
    T = {k: from_bytes(dt, shape, data) for k, (dt, shape, data, _) in raw.items()
         if not k.endswith((".rotary_emb.inv_freq",))}
    return c, T


def model_loss(d, batch, positions_from_batch=False, verbose=False):
    torch = torch_mod()
    import torch.nn.functional as F
    c, T = read_model(d)
    B, Tn, V = batch["rows"], batch["seq_len"], c["vocab"]
    idx = torch.from_numpy(batch["inputs"].astype("int64")).view(B, Tn)
    tgt = torch.from_numpy(batch["targets"].astype("int64")).view(-1)
    default_pos = torch.arange(Tn).expand(B, Tn)
    has_docs = len(batch["positions"]) or len(batch["segments"])
    if positions_from_batch:
        pos = torch.from_numpy(batch["positions"].astype("int64")).view(B, Tn) if len(batch["positions"]) \
            else default_pos
        seg = torch.from_numpy(batch["segments"].astype("int64")).view(B, Tn) if len(batch["segments"]) \
            else torch.zeros(B, Tn, dtype=torch.long)
    else:
        if has_docs and ((len(batch["segments"]) and batch["segments"].any()) or
                         (len(batch["positions"]) and (batch["positions"] != default_pos.reshape(-1).numpy()).any())):
            print("hf_models.py: warning: the batch holds packed documents; scoring it as plain rows (give "
                  "--positions-from-batch for forge's loss)", file=sys.stderr)
        pos, seg = default_pos, torch.zeros(B, Tn, dtype=torch.long)
    if int(idx.max()) >= V or int(tgt.max()) >= V:
        raise Bad(f"the batch has token ids outside the vocabulary of {V}")
    with torch.no_grad():
        if c["family"] == "gpt2":
            T = gpt2_canonical(T)
            if int(pos.max()) >= c["positions"]:
                raise Bad(f"position {int(pos.max())} is past GPT-2's table of {c['positions']}")
            logits = gpt2_forward(c, T, idx, pos, seg)
            gap = None
        else:
            P = hf_to_forge(c, T, d)
            embeds = None
            if "vision" in c:  # LLaVA: each picture's features in place of its run of positions
                if not len(batch["image_starts"]):
                    raise Bad(f"{d} is a LLaVA model, and the batch has no pictures")
                v = c["vision"]
                if batch["image_size"] != v["image_size"]:
                    raise Bad(f"the batch's pictures are {batch['image_size']} pixels, the model's {v['image_size']}")
                feats = mv().vision_features(dict(v, d_model=c["d_model"]), P, batch["pictures"])
                embeds = P["wte.weight"][idx].clone().view(B * Tn, -1)
                for k, start in enumerate(batch["image_starts"]):
                    embeds[int(start): int(start) + feats.shape[1]] = feats[k]
                embeds = embeds.view(B, Tn, -1)
            logits, routers = mf().forward(c, P, idx, pos, seg, strict=False, embeds=embeds)
            gap = router_gap(c, P, idx, pos, seg) if c["experts"] else None
    w = torch.ones(B * Tn, dtype=torch.float64)
    if len(batch["weights"]):
        w = torch.from_numpy(batch["weights"].astype("float64"))
    w = torch.where(tgt == -1, torch.zeros_like(w), w)
    ce = F.cross_entropy(logits.reshape(-1, V), tgt.clamp(min=0), reduction="none")
    if not w.sum() > 0:
        raise Bad("no position of the batch is scored")
    loss = float((ce * w).sum() / w.sum())
    if verbose:
        print(f"hf_models.py: {d}: {c['family']}, {B}x{Tn} positions, weight {float(w.sum()):g}, max |logit| "
              f"{float(logits.abs().max()):.4g}" + (f", smallest top-k probability gap {gap:.3g}" if gap is not None
                                                   else ""), file=sys.stderr)
    if gap is not None and gap < 1e-5:
        print(f"hf_models.py: warning: a routing decision hinges on {gap:.3g} of probability: float32 may "
              "route that token otherwise", file=sys.stderr)
    return loss


def router_gap(c, P, idx, pos, seg):
    """The smallest gap between the k-th and (k+1)-th router probability over every MoE block's tokens
    (routing that float32 rounding could flip makes forge's loss another function)."""
    m = mf()
    gaps = []
    orig = m.moe

    def spy(cc, PP, b, x, strict=True):
        torch = torch_mod()
        h = x.reshape(-1, x.shape[-1])
        probs = (h @ PP[b + "moe.router.weight"].t()).softmax(dim=1)
        sp = torch.sort(probs, dim=1, descending=True).values
        k = cc["top_k"]
        gaps.append(float((sp[:, k - 1] - sp[:, k]).min()) if k < sp.shape[1] else 1.0)
        return orig(cc, PP, b, x, strict)

    m.moe = spy
    try:
        m.forward(c, P, idx, pos, seg, strict=False)
    finally:
        m.moe = orig
    return min(gaps)


def cmd_loss(a):
    loss = model_loss(a.dir, read_batch(a.batch), a.positions_from_batch, a.verbose)
    want = []
    if a.expect_verification:
        path = os.path.join(a.expect_verification, "manifest.json")
        m = json.load(open(path))
        v = (m.get("meta", m).get("verification") or {}).get("loss")
        if v is None:
            raise Bad(f"{path}: no verification.loss")
        want.append((f"the verification loss of {a.expect_verification}", float(v)))
    if a.expect is not None:
        want.append((a.expect_what or "--expect", a.expect))
    if not want:
        print(repr(loss))
        return
    bad = False
    for what, value in want:
        rel = abs(loss - value) / max(1.0, abs(value))
        ok = rel <= a.rtol
        bad = bad or not ok
        print(f"{'ok' if ok else 'FAIL'}: {a.dir}: reference loss {loss!r}, {what} {value!r}: relative "
              f"difference {rel:.3g} ({'within' if ok else 'beyond'} {a.rtol:g})")
    if bad:
        sys.exit(1)


# ----------------------------------------------------------------------------------------------- hostile
HOSTILE = ["header-too-long", "header-len-wraps", "header-not-json", "offsets-past-end", "overlap", "dtype-size", "config-nan",
           "shape-2p63", "truncated", "missing-tensor", "extra-tensor", "misshapen", "unknown-arch",
           "rope-type", "relu", "missing-shard", "index-wrong-file", "tensor-in-two-shards", "llava-clip",
           "llava-feature-layer"]


def base_llama(vocab=64):
    """A small valid llama (numpy weights, no torch): config, ordered [(name, shape)], name -> bytes."""
    import numpy as np
    C, NH, KV, hd, H, L = 32, 4, 2, 8, 48, 2
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
           "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": KV, "head_dim": hd,
           "intermediate_size": H, "vocab_size": vocab, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
           "rope_theta": 500000.0, "rope_scaling": None, "hidden_act": "silu", "tie_word_embeddings": False,
           "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2,
           "torch_dtype": "float32"}
    shapes = [("model.embed_tokens.weight", (vocab, C))]
    for i in range(L):
        h = f"model.layers.{i}."
        shapes += [(h + "input_layernorm.weight", (C,)), (h + "self_attn.q_proj.weight", (NH * hd, C)),
                   (h + "self_attn.k_proj.weight", (KV * hd, C)), (h + "self_attn.v_proj.weight", (KV * hd, C)),
                   (h + "self_attn.o_proj.weight", (C, NH * hd)), (h + "post_attention_layernorm.weight", (C,)),
                   (h + "mlp.gate_proj.weight", (H, C)), (h + "mlp.up_proj.weight", (H, C)),
                   (h + "mlp.down_proj.weight", (C, H))]
    shapes += [("model.norm.weight", (C,)), ("lm_head.weight", (vocab, C))]
    rng = np.random.default_rng(7)
    data = {n: (np.ones(s, "<f4") if len(s) == 1 else (0.02 * rng.standard_normal(s)).astype("<f4")).tobytes()
            for n, s in shapes}
    return cfg, shapes, data


def layout_of(shapes, data, order=None):
    """header dict and data bytes of tensors in `order` (default: as listed)."""
    header, at, blob = {"__metadata__": {"format": "pt"}}, 0, []
    for n, s in (order or shapes):
        header[n] = {"dtype": "F32", "shape": list(s), "data_offsets": [at, at + len(data[n])]}
        at += len(data[n])
        blob.append(data[n])
    return header, b"".join(blob)


def write_hostile(out, case):
    """Writes the case's directory at `out`; returns (exit status, [patterns])."""
    os.makedirs(out, exist_ok=True)
    cfg, shapes, data = base_llama()
    st = os.path.join(out, "model.safetensors")
    header, blob = layout_of(shapes, data)
    expect = 65
    pats = ["model\\.safetensors"]

    def save_config(text=None):
        with open(os.path.join(out, "config.json"), "w") as f:
            f.write(text if text is not None else json.dumps(cfg, indent=2))

    if case == "header-too-long":
        write_raw_st(st, header, blob)
        size = os.path.getsize(st)
        with open(st, "r+b") as f:
            f.write(struct.pack("<Q", size + 100))
    elif case == "header-len-wraps":  # 8 + length wraps around 2^64 to 0
        write_raw_st(st, header, blob, header_len=2 ** 64 - 8)
    elif case == "header-not-json":
        text = b'{"model.norm.weight": {"dtype": "F32", "shape": [32], "data_offsets": [0, 128]'  # no closing
        text += b" " * ((8 - len(text) % 8) % 8)
        with open(st, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + blob)
    elif case == "offsets-past-end":
        name = shapes[-1][0]  # the last tensor's range moved past the end (its size kept)
        b, e = header[name]["data_offsets"]
        header[name]["data_offsets"] = [b + 4096, e + 4096]
        write_raw_st(st, header, blob)
        pats.append(re.escape(name))
    elif case == "overlap":
        # q_proj and o_proj of layer 0 are both [32, 32]: o_proj's range is q_proj's (no byte uncovered)
        qn, on = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight"
        order = [t for t in shapes if t[0] != on]
        header, blob = layout_of(shapes, data, order)
        header[on] = {"dtype": "F32", "shape": [32, 32], "data_offsets": list(header[qn]["data_offsets"])}
        write_raw_st(st, header, blob)
        pats += [re.escape(qn), re.escape(on)]  # both named
    elif case == "dtype-size":
        name = "model.layers.1.self_attn.v_proj.weight"
        header[name]["dtype"] = "F16"  # 16 x 32 F16 is 1024 bytes, its range holds 2048
        write_raw_st(st, header, blob)
        pats.append(re.escape(name))
    elif case == "config-nan":
        write_raw_st(st, header, blob)
        save_config(json.dumps(dict(cfg, rms_norm_eps=float("nan")), indent=2))  # writes the token NaN
        pats = ["config\\.json"]
    elif case == "shape-2p63":
        name = "model.norm.weight"
        header[name]["shape"] = [2 ** 63]
        write_raw_st(st, header, blob)
        pats.append(re.escape(name))
    elif case == "truncated":
        write_raw_st(st, header, blob)
        size = os.path.getsize(st)
        os.truncate(st, size - 1000)
    elif case == "missing-tensor":
        name = "model.layers.1.mlp.down_proj.weight"
        header, blob = layout_of(shapes, data, [t for t in shapes if t[0] != name])
        write_raw_st(st, header, blob)
        pats = [re.escape(name)]
    elif case == "extra-tensor":
        name = "model.layers.0.mlp.extra_proj.weight"
        data[name] = data["model.layers.0.mlp.gate_proj.weight"]
        header, blob = layout_of(shapes, data, shapes + [(name, (48, 32))])
        write_raw_st(st, header, blob)
        pats.append(re.escape(name))
    elif case == "misshapen":
        name = "model.layers.0.self_attn.k_proj.weight"  # [16, 32] stored as [32, 16]: same bytes
        header[name]["shape"] = [32, 16]
        write_raw_st(st, header, blob)
        pats.append(re.escape(name))
    elif case == "unknown-arch":
        cfg.update(architectures=["FalconForCausalLM"], model_type="falcon")
        write_raw_st(st, header, blob)
        pats = ["config\\.json", "architectures"]
    elif case == "rope-type":
        cfg["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
        write_raw_st(st, header, blob)
        pats = ["config\\.json", "rope_scaling", "dynamic"]
    elif case == "relu":
        cfg["hidden_act"] = "relu"
        write_raw_st(st, header, blob)
        pats = ["config\\.json", "hidden_act"]
    elif case == "missing-shard":
        half = len(shapes) // 2
        wm = {}
        for k, part in enumerate((shapes[:half], shapes[half:])):
            fn = f"model-{k + 1:05d}-of-00002.safetensors"
            h, bl = layout_of(part, data)
            write_raw_st(os.path.join(out, fn), h, bl)
            wm.update({n: fn for n, _ in part})
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": sum(len(v) for v in data.values())}, "weight_map": wm}, f)
        os.remove(os.path.join(out, "model-00002-of-00002.safetensors"))
        pats = ["model-00002-of-00002\\.safetensors"]
    elif case in ("index-wrong-file", "tensor-in-two-shards"):
        half = len(shapes) // 2
        name = shapes[0][0]  # the embedding: in shard 1
        parts = (shapes[:half], shapes[half:] + ([shapes[0]] if case == "tensor-in-two-shards" else []))
        wm = {}
        for k, part in enumerate(parts):
            fn = f"model-{k + 1:05d}-of-00002.safetensors"
            h, bl = layout_of(part, data)
            write_raw_st(os.path.join(out, fn), h, bl)
            wm.update({n: fn for n, _ in part if n not in wm})
        if case == "index-wrong-file":
            wm[name] = "model-00002-of-00002.safetensors"
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": sum(len(v) for v in data.values())}, "weight_map": wm}, f)
        pats = [re.escape(name)]
    elif case in ("llava-clip", "llava-feature-layer"):
        # the llama inside a LLaVA config: a CLIP tower (a vision_config naming no model_type is CLIP's),
        # or the projector reading the second-to-last block, as LLaVA-1.5 does
        write_raw_st(st, header, blob)
        vision = {"hidden_size": 24, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 2,
                  "image_size": 8, "patch_size": 4}
        if case == "llava-feature-layer":
            vision["model_type"] = "siglip_vision_model"
        cfg = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
               "text_config": {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")},
               "vision_config": vision, "image_token_index": 60, "projector_hidden_act": "gelu_pytorch_tanh",
               "vision_feature_select_strategy": "full",
               "vision_feature_layer": -2 if case == "llava-feature-layer" else -1}
        pats = ["config\\.json", "model_type" if case == "llava-clip" else "vision_feature_layer"]
    else:
        raise SystemExit(f"hostile: unknown case '{case}' (one of: {', '.join(HOSTILE)}, all)")
    if not os.path.exists(os.path.join(out, "config.json")):
        save_config()
    return expect, pats


def cmd_hostile(a):
    cases = HOSTILE if a.case == "all" else [a.case]
    for case in cases:
        code, pats = write_hostile(os.path.join(a.out, case) if a.case == "all" else a.out, case)
        print("\t".join([case, str(code)] + pats))


# ----------------------------------------------------------------------------------------------- compare
# config.json keys that change the model or what generation starts and stops on: an export must give them
# the imported values (or the class's default meaning of an absent one).
MODEL_KEYS = ["architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
              "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings",
              "hidden_act", "attention_bias", "mlp_bias", "num_local_experts", "num_experts_per_tok",
              "num_experts", "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step",
              "norm_topk_prob", "mlp_only_layers", "router_jitter_noise", "n_embd", "n_layer", "n_head",
              "n_positions", "n_inner", "layer_norm_epsilon", "activation_function", "torch_dtype",
              "bos_token_id", "eos_token_id"]


def _norm(key, value, cfg):
    if key == "n_inner" and value is None:
        return 4 * cfg.get("n_embd", 768)
    if key == "rope_scaling" and isinstance(value, dict):
        v = dict(value)
        if "type" in v and "rope_type" not in v:
            v["rope_type"] = v.pop("type")
        v.pop("type", None)
        return {k: (float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x) for k, x in v.items()}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def compare_configs(a, b, skip=()):
    """Differences of config b from a: every MODEL_KEYS key a has, and the model b's reading gives."""
    ca, cb = read_config(a), read_config(b)
    diffs = []
    for k in MODEL_KEYS:
        if k not in ca or k in skip:
            continue
        va, vb = _norm(k, ca[k], ca), _norm(k, cb.get(k), cb)
        if va != vb:
            diffs.append(f"config.json {k}: {ca[k]!r} in {a}, {cb.get(k, '(absent)')!r} in {b}")
    try:
        ma, mb = config_model(ca), config_model(cb)
    except Bad as e:
        return diffs + [str(e)]
    for k in sorted(set(ma) | set(mb)):
        if ma.get(k) != mb.get(k):
            diffs.append(f"config.json reads as model {k} = {ma.get(k)!r} from {a}, {mb.get(k)!r} from {b}")
    return diffs


AUX_FILES = ["generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
             "special_tokens_map.json"]
ST_NAME = {"f32": "F32", "bf16": "BF16", "f16": "F16"}


def cmd_compare_hf(a):
    diffs = []
    ra, rb = read_raw_dir(a.a), read_raw_dir(a.b)
    model = config_model(read_config(a.a))
    if model["family"] == "gpt2":  # the hub's files may name GPT-2's tensors without "transformer." and hold mask buffers
        canon = lambda r: {("transformer." + k if not k.startswith("transformer.") and k != "lm_head.weight"
                            else k): v for k, v in r.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
        ra, rb = canon(ra), canon(rb)
    if "vision" in model:
        canon = lambda r: {llava_canonical(k): v for k, v in r.items() if not llava_canonical(k).startswith(LLAVA_UNUSED)}
        ra, rb = canon(ra), canon(rb)
    if a.convert:  # A's values as B should hold them in that dtype: rounded to nearest even by torch
        st = ST_NAME[a.convert]
        ra = {k: (st, shape, to_bytes(from_bytes(dt, shape, data), st), fn) for k, (dt, shape, data, fn) in ra.items()}
    for n in sorted(set(ra) | set(rb)):
        if n not in ra or n not in rb:
            diffs.append(f"tensor '{n}' is only in {a.a if n in ra else a.b}")
            continue
        (da, sa, ba, fa), (db, sb, bb, fb) = ra[n], rb[n]
        if (da, sa) != (db, sb):
            diffs.append(f"tensor '{n}': {da} {sa} in {a.a}/{fa}, {db} {sb} in {a.b}/{fb}")
        elif ba != bb:
            import numpy as np
            x, y = np.frombuffer(ba, np.uint8), np.frombuffer(bb, np.uint8)
            diffs.append(f"tensor '{n}': bytes differ ({int((x != y).sum())} of {len(ba)}, first at "
                         f"{int(np.argmax(x != y))})")
    diffs += compare_configs(a.a, a.b, skip={"torch_dtype"} if a.convert else set())
    if a.convert:
        want = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[a.convert]
        if read_config(a.b).get("torch_dtype") != want:
            diffs.append(f"{a.b}/config.json: torch_dtype {read_config(a.b).get('torch_dtype')!r}, not {want!r}")
    for f in AUX_FILES:  # the files a model directory carries besides the weights, handed on as they were
        pa, pb = os.path.join(a.a, f), os.path.join(a.b, f)
        if os.path.exists(pa) and (not os.path.exists(pb) or open(pa, "rb").read() != open(pb, "rb").read()):
            diffs.append(f"{f}: {'not the same bytes in' if os.path.exists(pb) else 'missing from'} {a.b}")
    if not os.path.exists(os.path.join(a.b, "generation_config.json")):
        diffs.append(f"{a.b} has no generation_config.json")
    files, wm = model_files(a.b)
    if a.shards_of is not None:
        # every file holds at most --shard-size bytes of tensors, unless it holds a single bigger tensor
        per = {}
        for n, (_, _, data, fn) in rb.items():
            per.setdefault(fn, []).append(len(data))
        if wm is None or len(files) < 2:
            diffs.append(f"{a.b}: {len(files)} file(s), expected shards of at most {a.shards_of} bytes")
        for fn, sizes in per.items():
            if sum(sizes) > a.shards_of and len(sizes) > 1:
                diffs.append(f"{a.b}/{fn}: {sum(sizes)} bytes of {len(sizes)} tensors, over {a.shards_of}")
        index = json.load(open(os.path.join(a.b, "model.safetensors.index.json")))
        total = sum(len(v[2]) for v in rb.values())
        if index.get("metadata", {}).get("total_size") != total:
            diffs.append(f"{a.b}: index metadata.total_size {index.get('metadata', {}).get('total_size')}, "
                         f"the tensors hold {total}")
        for k, fn in enumerate(files):
            if fn != f"model-{k + 1:05d}-of-{len(files):05d}.safetensors":
                diffs.append(f"{a.b}: shard {fn} is not named model-{k + 1:05d}-of-{len(files):05d}.safetensors")
    if diffs:
        raise Bad("\n".join(diffs[:30]))
    print(f"same tensors ({len(ra)}{', converted to ' + a.convert if a.convert else ''}) and config: {a.a} -> "
          f"{a.b} ({len(files)} file{'s' if len(files) > 1 else ''})")


def cmd_model_config(a):
    """The checkpoint's model record (manifest.json model_config) is the model config.json describes, as
    read here (config_model): every key that changes the math, float32 keys compared as float32."""
    import numpy as np
    path = os.path.join(a.ckpt, "manifest.json")
    rec = json.load(open(path)).get("model_config")
    if not isinstance(rec, dict):
        raise Bad(f"{path}: no model_config")
    c = config_model(read_config(a.dir), os.path.join(a.dir, "config.json"))
    onoff = lambda v: "on" if v else "off"
    want = {"family": c["family"], "layers": c["layers"], "d_model": c["d_model"], "heads": c["heads"],
            "vocab": c["vocab"], "max_positions": c["positions"]}
    if c["family"] == "gpt2":
        want.update(ffn_hidden=c["ffn_hidden"], norm_eps=c["norm_eps"], tied_embeddings="on",
                    positions="learned", norm="layernorm", activation="gelu", linear_bias="on")
        required = {"layers", "d_model", "heads", "vocab", "max_positions"}
    else:
        want.update(kv_heads=c["kv_heads"], head_dim=c["head_dim"], norm_eps=c["norm_eps"], norm="rmsnorm",
                    positions="rope", rope_theta=c["rope_theta"], rope_scaling=c["rope_scaling"],
                    window=c["window"], qkv_bias=onoff(c["qkv_bias"]), qk_norm=onoff(c["qk_norm"]),
                    tied_embeddings=onoff(c["tied_embeddings"]), linear_bias="off", activation="swiglu")
        if c["rope_scaling"] == "llama3":
            want.update(rope_factor=c["rope_factor"], rope_low_freq_factor=c["rope_low_freq_factor"],
                        rope_high_freq_factor=c["rope_high_freq_factor"],
                        rope_original_positions=c["rope_original_positions"])
        if c["experts"]:
            want.update(ffn="moe", experts=c["experts"], top_k=c["top_k"], moe_hidden=c["moe_hidden"],
                        moe_every=1, router_renormalize=onoff(c["router_renormalize"]),
                        shared_expert_hidden=c["shared_expert_hidden"])
        else:
            want.update(ffn="dense", ffn_hidden=c["ffn_hidden"])
        if "vision" in c:
            v = c["vision"]
            want.update({"vision.layers": v["vision_layers"], "vision.image_size": v["image_size"],
                         "vision.patch": v["patch"], "vision.width": v["vision_width"],
                         "vision.heads": v["vision_heads"], "vision.mlp_hidden": v["vision_mlp_hidden"],
                         "vision.projector_hidden": c["d_model"], "vision.norm_eps": v["vision_norm_eps"],
                         "vision.post_norm": "off"})
        required = set(want)
    diffs = []
    for k, v in want.items():
        if k not in rec:
            if k in required:
                diffs.append(f"model.{k}: absent, config.json makes it {v!r}")
            continue
        r = rec[k]
        same = np.float32(r) == np.float32(v) if k.endswith("norm_eps") else \
            (float(r) == float(v) if isinstance(v, float) else r == v)
        if not same:
            diffs.append(f"model.{k}: checkpoint {r!r}, config.json makes it {v!r}")
    if diffs:
        raise Bad(f"{a.ckpt} is not the model of {a.dir}/config.json: " + "; ".join(diffs))
    print(f"model config of {a.ckpt}: {len(want)} keys as config.json says")


def cmd_same_params(a):
    import h5py, numpy as np

    def params(path):
        out = {}
        with h5py.File(path, "r") as f:
            def visit(name, obj):
                if isinstance(obj, h5py.Dataset):
                    out[name] = (obj.attrs.get("dtype"), obj.dtype.str, obj.shape, np.asarray(obj[()]).tobytes())
            f["param"].visititems(visit)
        return out

    pa, pb = params(a.a), params(a.b)
    diffs = [f"param/{n} is only in {a.a if n in pa else a.b}" for n in sorted(set(pa) ^ set(pb))]
    for n in sorted(set(pa) & set(pb)):
        if pa[n][:3] != pb[n][:3]:
            diffs.append(f"param/{n}: {pa[n][:3]} vs {pb[n][:3]}")
        elif pa[n][3] != pb[n][3]:
            diffs.append(f"param/{n}: the values differ")
    if not pa:
        diffs.append(f"{a.a}: no /param tensors")
    if diffs:
        print("\n".join(diffs[:30]), file=sys.stderr)
        sys.exit(1)
    print(f"bit-identical /param tensors ({len(pa)})")


# ---------------------------------------------------------------------------------- SigLIP vision tower
def cmd_siglip(a):
    """A SiglipVisionModel directory holding the tower of the LLaVA model at --llava under SigLIP's own names
    (vision_model.*), with its post_layernorm and a pooling head (head.probe, which LLaVA drops), in --dtype."""
    torch = torch_mod()
    cfg = read_config(a.llava)
    T = {}
    for k, (dt, shape, data, _) in read_raw_dir(a.llava).items():
        k = llava_canonical(k)
        if k.startswith("vision_tower."):
            T[k[len("vision_tower."):]] = from_bytes(dt, shape, data)
    W = cfg["vision_config"]["hidden_size"]
    T["vision_model.head.probe"] = torch.randn(1, 1, W, generator=torch.Generator().manual_seed(LLAVA_SEED))
    if a.drop:
        del T[a.drop]
    st = {"f32": "F32", "bf16": "BF16"}[a.dtype]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(dict(cfg["vision_config"], architectures=["SiglipVisionModel"], model_type="siglip_vision_model",
                       torch_dtype={"f32": "float32", "bf16": "bfloat16"}[a.dtype],
                       _name_or_path="forge-test/siglip-tiny"), f, indent=2, sort_keys=True)
    st_write(os.path.join(a.out, "model.safetensors"),
             sorted((n, st, list(t.shape), to_bytes(t, st)) for n, t in T.items()))


def cmd_same_tower(a):
    """Every vision.* parameter of a forge checkpoint's HDF5 export (forge-ckpt export --params-only) holds
    the SigLIP directory's tensor it maps to, bit for bit (vision.ln_post: its post_layernorm)."""
    import h5py, numpy as np
    cfg = read_config(a.siglip)
    g = lambda k, default: cfg.get(k, default)
    v = dict(vision_layers=g("num_hidden_layers", 12), image_size=g("image_size", 224), patch=g("patch_size", 16),
             vision_width=g("hidden_size", 768))
    T = {k: from_bytes(dt, shape, data).to(torch_mod().float32).numpy()
         for k, (dt, shape, data, _) in read_raw_dir(a.siglip).items()}
    with h5py.File(a.h5, "r") as f:
        P = {n: np.asarray(d[()], dtype=np.float32) for n, d in f["param"].items() if n.startswith("vision.")}
    rows = tower_layout(v, "vision_model.")
    if "vision.ln_post.weight" in P:
        rows += [("vision_model.post_layernorm." + x, "vision.ln_post." + x, None, 0, None) for x in ("weight", "bias")]
    diffs, seen = [], set()
    for hf, fp, _, r0, n in rows:
        seen.add(fp)
        if fp not in P:
            diffs.append(f"{a.h5}: no param/{fp}")
            continue
        piece = P[fp] if n is None else P[fp][r0:r0 + n]
        if piece.tobytes() != T[hf].reshape(piece.shape).tobytes():
            diffs.append(f"param/{fp}{'' if n is None else f' rows [{r0}, {r0 + n})'} is not {hf}")
    diffs += [f"param/{n}: no SigLIP tensor maps to it" for n in sorted(set(P) - seen)]
    if diffs:
        print("\n".join(diffs[:30]), file=sys.stderr)
        sys.exit(1)
    print(f"the SigLIP tower, bit for bit ({len(seen)} parameters)")


# -------------------------------------------------------------------------------------------------- main
def parser():
    ap = argparse.ArgumentParser(prog="hf_models.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--family", required=True, choices=FAMILY_NAMES)
    w.add_argument("--dtype", required=True, choices=["f32", "bf16"])
    w.add_argument("--shards", type=int, default=1)
    w.add_argument("--vocab", type=int, required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--seed", type=int)
    w.add_argument("--legacy-names", action="store_true",
                   help="gpt2: tensor names without 'transformer.' and the h.N.attn.bias mask buffers, as the "
                   "hub's gpt2 files have them")
    w.add_argument("--new-names", action="store_true",
                   help="llava: the names transformers >= 4.52 saves (model.language_model., model.vision_tower.)")
    w.add_argument("--tokenizer", action="store_true",
                   help="also tokenizer.json, tokenizer_config.json, special_tokens_map.json (word-level)")
    w.set_defaults(fn=cmd_write)
    lo = sub.add_parser("loss")
    lo.add_argument("--dir", required=True)
    lo.add_argument("--batch", required=True)
    lo.add_argument("--positions-from-batch", action="store_true")
    lo.add_argument("--verbose", action="store_true")
    lo.add_argument("--expect-verification", metavar="CKPT",
                    help="compare with the checkpoint's verification.loss (manifest.json); exit 1 beyond --rtol")
    lo.add_argument("--expect", type=float, help="compare with this loss; exit 1 beyond --rtol")
    lo.add_argument("--expect-what", help="what --expect is, for the message")
    lo.add_argument("--rtol", type=float, default=1e-5,
                    help="relative tolerance |ref - forge| / max(1, |forge|) (default 1e-5)")
    lo.set_defaults(fn=cmd_loss)
    h = sub.add_parser("hostile")
    h.add_argument("--out", required=True)
    h.add_argument("--case", required=True)
    h.set_defaults(fn=cmd_hostile)
    c = sub.add_parser("compare-hf")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--convert", choices=["f32", "bf16", "f16"],
                   help="B holds A's values in this dtype (rounded to nearest even)")
    c.add_argument("--shards-of", type=int, metavar="BYTES",
                   help="B is sharded: files of at most BYTES of tensors (a bigger tensor alone), an index")
    c.set_defaults(fn=cmd_compare_hf)
    mc = sub.add_parser("model-config")
    mc.add_argument("ckpt")
    mc.add_argument("dir")
    mc.set_defaults(fn=cmd_model_config)
    s = sub.add_parser("same-params")
    s.add_argument("a")
    s.add_argument("b")
    s.set_defaults(fn=cmd_same_params)
    sg = sub.add_parser("siglip")
    sg.add_argument("--llava", required=True)
    sg.add_argument("--dtype", required=True, choices=["f32", "bf16"])
    sg.add_argument("--out", required=True)
    sg.add_argument("--drop", help="leave this tensor out (a hostile directory)")
    sg.set_defaults(fn=cmd_siglip)
    t = sub.add_parser("same-tower")
    t.add_argument("h5")
    t.add_argument("siglip")
    t.set_defaults(fn=cmd_same_tower)
    b = sub.add_parser("batch")
    b.set_defaults(fn=cmd_batch)
    return ap


def cmd_batch(_):
    """Every line is run even when one fails (each failure says so on stderr); exit 1 if any did."""
    ap = parser()
    failed = 0
    for line in sys.stdin:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            a = ap.parse_args(shlex.split(line))
            if a.cmd == "batch":
                raise SystemExit("batch: not inside batch")
            run(a)
        except SystemExit as e:
            if e.code not in (None, 0):
                if not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
                print(f"hf_models.py batch: failed: {line.strip()}", file=sys.stderr)
                failed += 1
        sys.stdout.flush()
        sys.stderr.flush()
    if failed:
        sys.exit(1)


def run(a):
    try:
        a.fn(a)
    except Bad as e:
        print(f"hf_models.py {a.cmd}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run(parser().parse_args())
