#!/usr/bin/env python3
"""The reference side of hf_generate_test.sh (forge-gate generate and evaluate on an imported model).

  make DIR     turns the tiny Llama model test/ckpt/reference/hf_models.py wrote in DIR into a chat model
               whose next token depends on the last token only: every block's output projections are zero,
               so the final hidden state is the last token's embedding, a one-hot row; the classifier maps
               it to a fixed successor. From the last token of the generation prompt ("\\n") it writes
               REPLY, then <|im_end|>, then TURN_END, then "!" for ever. Adds the tokenizer files of a model
               with a chat template: Qwen2's tokenizer.json fixture (test/dataio/fixtures/hf_tokenizers),
               tokenizer_config.json with Qwen2.5-Instruct's template (test/dataio/fixtures/chat_templates)
               and eos_token <|im_end|>, generation_config.json with eos_token_id [<|endoftext|>].
  turn DIR     writes DIR/tokenizer_config.json with a template whose turns end with TURN_END, several
               tokens in this tokenizer: a stop string.
  check FILE CASE [MAX_NEW]
               checks forge-gate generate --ids output FILE: each line's prompt_ids are the encoding of the
               template's text for its messages (rendered by python3-jinja2 as transformers does,
               test/dataio/reference/render_templates.py; encoded by the independent byte-level BPE
               test/dataio/reference/bpe_reference.py), and the completion is what the chain writes up to
               the stop. CASE: own (Qwen2.5's template: stops at <|im_end|>), turn (the turn template: stops
               at TURN_END, which the text leaves out) or text (no template: only <|endoftext|> stops).
Run with Debian's /usr/bin/python3 (numpy, python3-jinja2, python3-regex).
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "test", "dataio", "reference"))
import bpe_reference  # noqa: E402
import render_templates  # noqa: E402

TOKENIZER = os.path.join(SRC, "test", "dataio", "fixtures", "hf_tokenizers", "qwen2.json")
TEMPLATE = os.path.join(SRC, "test", "dataio", "fixtures", "chat_templates", "qwen2.5-7b-instruct.jinja")
EOS_TOKEN = "<|im_end|>"
REPLY = "Hello world"
TURN_END = "</turn>"
TURN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}" + TURN_END + "\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SCALE = 10.0  # the successor's logit over the others' 0, times sqrt(d_model) from the final norm


def reference():
    return bpe_reference.Reference(TOKENIZER)


def token_id(ref, content):
    return next(t["id"] for t in ref.added if t["content"] == content)


def chain(ref):
    """The tokens the model writes from the generation prompt's last token, in order."""
    last = ref.encode("<|im_start|>assistant\n")[-1]
    reply, turn_end = ref.encode(REPLY), ref.encode(TURN_END)
    bang = ref.encode("!")
    assert len(reply) >= 2 and len(turn_end) >= 2 and len(bang) == 1, (reply, turn_end, bang)
    seq = [last] + reply + [token_id(ref, EOS_TOKEN)] + turn_end + bang
    assert len(set(seq)) == len(seq), seq
    return seq


def read_safetensors(path):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return data, header, 8 + n


def cmd_make(d):
    ref = reference()
    seq = chain(ref)
    path = os.path.join(d, "model.safetensors")
    data, header, base = read_safetensors(path)

    def put(name, array):
        t = header[name]
        assert t["dtype"] == "F32" and list(array.shape) == t["shape"], (name, t, array.shape)
        lo, hi = t["data_offsets"]
        data[base + lo:base + hi] = array.astype("<f4").tobytes()

    V, C = header["model.embed_tokens.weight"]["shape"]
    assert len(seq) <= C, (len(seq), C)
    embed, head = np.zeros((V, C)), np.zeros((V, C))
    for k, t in enumerate(seq):
        embed[t, k] = 1
        head[seq[min(k + 1, len(seq) - 1)], k] = SCALE  # the last one ("!") follows itself
    put("model.embed_tokens.weight", embed)
    put("lm_head.weight", head)
    put("model.norm.weight", np.ones(C))
    for name, t in header.items():
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            put(name, np.zeros(t["shape"]))
    with open(path, "wb") as f:
        f.write(data)
    shutil.copyfile(TOKENIZER, os.path.join(d, "tokenizer.json"))
    with open(TEMPLATE, encoding="utf-8", newline="") as f:
        template = f.read()
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": False, "bos_token": None, "eos_token": EOS_TOKEN, "chat_template": template,
                   "model_max_length": 1024, "tokenizer_class": "Qwen2Tokenizer"}, f, indent=2)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [token_id(ref, "<|endoftext|>")]}, f, indent=2)
    for stale in ("special_tokens_map.json", "tokenizer.model"):
        if os.path.exists(os.path.join(d, stale)):
            os.remove(os.path.join(d, stale))


def cmd_turn(d):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": TURN_TEMPLATE}, f, indent=2)


def render(template, messages, **tokens):
    env = render_templates.make_environment()
    return env.from_string(template).render(messages=messages, tools=None, documents=None,
                                            add_generation_prompt=True, date_string=render_templates.DATE_STRING,
                                            **tokens)


def cmd_check(path, case, max_new=8):
    ref = reference()
    seq = chain(ref)
    im_end = token_id(ref, EOS_TOKEN)
    reply = seq[1:seq.index(im_end)]
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert rows, path
    with open(TEMPLATE, encoding="utf-8", newline="") as f:
        qwen = f.read()
    for r in rows:
        messages = r.get("messages") or [{"role": "user", "content": r["prompt"]}]
        if case == "own":
            text = render(qwen, messages, eos_token=EOS_TOKEN)
            want_ids, want_text, want_stop = reply, REPLY, EOS_TOKEN
        elif case == "turn":
            text = render(TURN_TEMPLATE, messages)
            end = seq.index(im_end) + 1 + len(ref.encode(TURN_END))
            want_ids, want_text, want_stop = seq[1:end], REPLY + EOS_TOKEN, TURN_END
        else:
            text = r["prompt"]
            want_ids = (seq[1:] + [seq[-1]] * max_new)[:max_new]
            want_text, want_stop = ref.decode(want_ids), None
        assert r["prompt_ids"] == ref.encode(text), (case, r["prompt_ids"], ref.encode(text), text)
        assert r["completion_ids"] == want_ids, (case, r["completion_ids"], want_ids)
        assert r["completion"] == want_text, (case, r["completion"], want_text)
        assert r["tokens"] == len(want_ids), r
        assert r["stopped"] == (want_stop is not None), r
        assert r.get("stop") == want_stop, (r.get("stop"), want_stop)
    print(f"{path}: {len(rows)} completion(s) as the {case} case wants")


def main(argv):
    if len(argv) >= 2 and argv[0] == "make":
        cmd_make(argv[1])
    elif len(argv) >= 2 and argv[0] == "turn":
        cmd_turn(argv[1])
    elif len(argv) >= 3 and argv[0] == "check":
        cmd_check(argv[1], argv[2], *(int(x) for x in argv[3:]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
