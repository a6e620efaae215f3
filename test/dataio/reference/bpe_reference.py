#!/usr/bin/python3
"""Independent reference for forge's Hugging Face tokenizer.json support (dataio/src/hf_tokenizer.cpp).

Written from the published algorithms -- GPT-2's encoder.py (bytes_to_unicode, the bigram merge loop) and
the Hugging Face tokenizers documentation of tokenizer.json (added tokens, normalizers, pre-tokenizers,
BPE with byte_fallback / ignore_merges, decoders) -- not from transformers or tokenizers (neither is
packaged for Debian). Regular expressions run on the `regex` module (python3-regex), Unicode
normalization on `unicodedata`; forge runs PCRE2 and ICU, so the two sides share no code.

  generate [OUT_DIR]   trains four small BPE vocabularies on a deterministic synthetic corpus, each in one
                       model family's style, writes each as a real-format tokenizer.json, and writes the
                       expected ids and decodes of the Unicode test cases (default OUT_DIR:
                       test/dataio/fixtures/hf_tokenizers). Byte-identical on every run.
  check [DIR]          generates into a temporary directory and compares with DIR (exit 1 on a difference).
  bench TOKENIZER TEXT_FILE   prints this implementation's encode MB/s (one core, a cache per pre-token)
                              over TEXT_FILE's lines (bench/tokenizer.sh).

The families:
  gpt2          GPT-2: ByteLevel pre-tokenizer with its own regex, merges as "a b" strings, <|endoftext|>,
                a <mask> token with lstrip (as RoBERTa ships it).
  llama3        Llama 3: Split(Isolated) with Llama 3's pattern + ByteLevel(use_regex=false), ignore_merges,
                merges as [a, b] pairs, Llama 3's special tokens; a few whole words in the vocabulary
                that the merges do not build, so ignore_merges changes encodings.
  qwen2         Qwen2: NFC normalizer, Split(Isolated) with Qwen2's pattern (single digits) + ByteLevel,
                <|endoftext|>, <|im_start|>, <|im_end|> and two non-special added tokens.
  bytefallback  Llama 2 style without a pre-tokenizer: Prepend + Replace normalizers, characters as the
                base alphabet, byte_fallback to <0xXX>, decoder Replace + ByteFallback + Fuse + Strip.
"""
import hashlib
import heapq
import json
import os
import sys
import tempfile
import time
import unicodedata

import regex

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Unicode White_Space: Rust's char::is_whitespace, which lstrip/rstrip of added tokens use.
WHITE_SPACE = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)}


def bytes_to_unicode():
    """GPT-2's reversible map from the 256 bytes to printable characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_ENCODER = bytes_to_unicode()
BYTE_DECODER = {c: b for b, c in BYTE_ENCODER.items()}


# ----------------------------------------------------------------------------------------------------------
# The reference tokenizer: reads a tokenizer.json and encodes/decodes as the tokenizers library documents.

class Reference:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            self.spec = json.load(f)
        model = self.spec["model"]
        assert model.get("type", "BPE") == "BPE"
        self.vocab = model["vocab"]
        self.ranks = {}
        for rank, m in enumerate(model["merges"]):
            pair = tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
            self.ranks.setdefault(pair, rank)
        self.byte_fallback = model.get("byte_fallback", False)
        self.ignore_merges = model.get("ignore_merges", False)
        self.unk = model.get("unk_token")
        self.fuse_unk = model.get("fuse_unk", False)
        self.added = self.spec.get("added_tokens", [])
        self.id_to_piece = {i: p for p, i in self.vocab.items()}
        for t in self.added:
            self.id_to_piece[t["id"]] = t["content"]
        raw = [t for t in self.added if not t.get("normalized", False)]
        norm = [dict(t, content=self.normalize(t["content"])) for t in self.added if t.get("normalized", False)]
        self.raw_matcher = self._matcher(raw)
        self.norm_matcher = self._matcher(norm)
        self.cache = None

    # --- added tokens: leftmost-longest matches, with single_word / lstrip / rstrip.
    @staticmethod
    def _matcher(tokens):
        if not tokens:
            return None
        tokens = sorted(tokens, key=lambda t: (-len(t["content"]), t["content"]))
        pattern = regex.compile("|".join(regex.escape(t["content"]) for t in tokens))
        return pattern, {t["content"]: t for t in tokens}

    @staticmethod
    def _split_added(text, matcher):
        """[(id or None, substring)]: the added tokens found in text and the text between them."""
        if matcher is None:
            return [(None, text)]
        pattern, by_content = matcher
        out, at = [], 0
        for m in pattern.finditer(text):
            start, stop = m.span()
            if start < at:
                continue
            tok = by_content[m.group()]
            if tok.get("single_word", False):
                before = start > 0 and regex.match(r"\w", text[start - 1])
                after = stop < len(text) and regex.match(r"\w", text[stop])
                if before or after:
                    continue
            if tok.get("lstrip", False):
                while start > at and text[start - 1] in WHITE_SPACE:
                    start -= 1
            if tok.get("rstrip", False):
                while stop < len(text) and text[stop] in WHITE_SPACE:
                    stop += 1
            if start > at:
                out.append((None, text[at:start]))
            out.append((tok["id"], text[start:stop]))
            at = stop
        if at < len(text):
            out.append((None, text[at:]))
        return out

    # --- normalizers
    def normalize(self, text):
        return self._normalize(self.spec.get("normalizer"), text)

    def _normalize(self, n, text):
        if n is None:
            return text
        kind = n["type"]
        if kind in ("NFC", "NFD", "NFKC", "NFKD"):
            return unicodedata.normalize(kind, text)
        if kind == "Sequence":
            for sub in n["normalizers"]:
                text = self._normalize(sub, text)
            return text
        if kind == "Prepend":
            return n["prepend"] + text if text else text
        if kind == "Replace":
            if "String" in n["pattern"]:
                return text.replace(n["pattern"]["String"], n["content"])
            return regex.sub(n["pattern"]["Regex"], lambda m: n["content"], text)
        raise ValueError(kind)

    # --- pre-tokenizers: each maps a list of pieces to a list of pieces.
    def _pre_tokenize(self, p, pieces):
        if p is None:
            return pieces
        kind = p["type"]
        if kind == "Sequence":
            for sub in p["pretokenizers"]:
                pieces = self._pre_tokenize(sub, pieces)
            return pieces
        if kind == "ByteLevel":
            out = []
            for s in pieces:
                if p.get("add_prefix_space", True) and not s.startswith(" "):
                    s = " " + s
                parts = self._split(regex.compile(GPT2_PATTERN), s, "Isolated") if p.get("use_regex", True) else [s]
                out += ["".join(BYTE_ENCODER[b] for b in part.encode("utf-8")) for part in parts]
            return out
        if kind == "Split":
            pat = p["pattern"]
            compiled = regex.compile(pat["Regex"] if "Regex" in pat else regex.escape(pat["String"]))
            return [x for s in pieces for x in self._split(compiled, s, p["behavior"], p.get("invert", False))]
        if kind == "Digits":
            behavior = "Isolated" if p.get("individual_digits", False) else "Contiguous"
            return [x for s in pieces for x in self._split(regex.compile(r"\p{N}"), s, behavior)]
        raise ValueError(kind)

    @staticmethod
    def _split(compiled, s, behavior, invert=False):
        """The library's split: the string as (text, is_match) spans, folded by the delimiter behavior."""
        spans, at = [], 0
        for m in compiled.finditer(s):
            if m.start() > at:
                spans.append([s[at:m.start()], invert])
            spans.append([m.group(), not invert])
            at = m.end()
        if at < len(s):
            spans.append([s[at:], invert])
        if behavior == "Removed":
            out = [t for t, is_match in spans if not is_match]
        elif behavior == "Isolated":
            out = [t for t, _ in spans]
        elif behavior == "Contiguous":  # runs of matches (or of non-matches) become one piece
            out, prev = [], False
            for t, is_match in spans:
                if out and is_match == prev:
                    out[-1] += t
                else:
                    out.append(t)
                prev = is_match
        elif behavior == "MergedWithPrevious":  # a match joins the piece before it, unless that is a match
            out, prev = [], False
            for t, is_match in spans:
                if out and is_match and not prev:
                    out[-1] += t
                else:
                    out.append(t)
                prev = is_match
        elif behavior == "MergedWithNext":  # a match joins the piece after it, unless that is a match
            out, prev = [], False
            for t, is_match in reversed(spans):
                if out and is_match and not prev:
                    out[-1] = t + out[-1]
                else:
                    out.append(t)
                prev = is_match
            out.reverse()
        else:
            raise ValueError(behavior)
        return [x for x in out if x]

    # --- the BPE model: GPT-2's loop (merge the lowest-ranked bigram everywhere, repeat).
    def _symbols(self, word):
        symbols, unk = [], None
        for ch in word:
            if ch in self.vocab:
                if unk is not None:
                    symbols.append(unk)
                    unk = None
                symbols.append(ch)
                continue
            if self.byte_fallback:
                pieces = ["<0x%02X>" % b for b in ch.encode("utf-8")]
                if all(x in self.vocab for x in pieces):
                    symbols += pieces
                    continue
            if self.unk is not None:
                if unk is not None and not self.fuse_unk:
                    symbols.append(unk)
                unk = self.unk
        if unk is not None:
            symbols.append(unk)
        return symbols

    def _bpe(self, word):
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        parts = self._symbols(word)
        while len(parts) > 1:
            pairs = set(zip(parts, parts[1:]))
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            a, b = best
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == a and parts[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return [self.vocab[p] for p in parts]

    def encode(self, text):
        ids = []
        for tok_id, seg in self._split_added(text, self.raw_matcher):
            if tok_id is not None:
                ids.append(tok_id)
                continue
            for tok_id2, seg2 in self._split_added(self.normalize(seg), self.norm_matcher):
                if tok_id2 is not None:
                    ids.append(tok_id2)
                    continue
                for word in self._pre_tokenize(self.spec.get("pre_tokenizer"), [seg2] if seg2 else []):
                    if self.cache is None:
                        ids += self._bpe(word)
                    else:
                        got = self.cache.get(word)
                        if got is None:
                            got = self.cache[word] = self._bpe(word)
                        ids += got
        return ids

    # --- decoders: each maps the list of token strings to a list of strings (the library's decode_chain).
    def _decode_chain(self, d, tokens):
        kind = d["type"]
        if kind == "Sequence":
            for sub in d["decoders"]:
                tokens = self._decode_chain(sub, tokens)
            return tokens
        if kind == "ByteLevel":
            out = bytearray()
            for t in tokens:
                if all(c in BYTE_DECODER for c in t):
                    out += bytes(BYTE_DECODER[c] for c in t)
                else:
                    out += t.encode("utf-8")
            return [out.decode("utf-8", errors="replace")]
        if kind == "Replace":
            if "String" in d["pattern"]:
                return [t.replace(d["pattern"]["String"], d["content"]) for t in tokens]
            return [regex.sub(d["pattern"]["Regex"], lambda m: d["content"], t) for t in tokens]
        if kind == "ByteFallback":
            out, pending = [], bytearray()

            def flush():
                if pending:
                    try:
                        out.append(pending.decode("utf-8"))
                    except UnicodeDecodeError:
                        out.extend(["\ufffd"] * len(pending))
                    pending.clear()
            for t in tokens:
                if regex.fullmatch(r"<0x[0-9A-Fa-f]{2}>", t):
                    pending.append(int(t[3:5], 16))
                else:
                    flush()
                    out.append(t)
            flush()
            return out
        if kind == "Fuse":
            return ["".join(tokens)]
        if kind == "Strip":
            c, start, stop = d["content"], d["start"], d["stop"]
            out = []
            for t in tokens:
                i = 0
                while i < start and i < len(t) and t[i] == c:
                    i += 1
                j = len(t)
                while len(t) - j < stop and j > i and t[j - 1] == c:
                    j -= 1
                out.append(t[i:j])
            return out
        raise ValueError(kind)

    def decode(self, ids):
        tokens = [self.id_to_piece[i] for i in ids]
        d = self.spec.get("decoder")
        if d is None:
            return " ".join(tokens)
        return "".join(self._decode_chain(d, tokens))


# ----------------------------------------------------------------------------------------------------------
# Test cases: the Unicode corpus every fixture is checked on.

CASES = [
    "",
    " ",
    "a",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, but we've seen what you'd do and they're not.",
    "I'M SURE THEY'LL SAY IT'S FINE, BUT WE'VE SEEN WHAT YOU'D DO AND THEY'RE NOT.",
    "Don'T mIx CaSe'S lIkE tHiS'Ll Do; O'Reilly's rock'n'roll",
    "a's b't c're d've e'm f'll g'd 'S 'T 'RE 'VE 'M 'LL 'D",
    "\u2018curly\u2019s quotes\u2019 and \u201cdouble\u201d ones",
    "a  b   c    d     e",
    "tabs\t\tand\tmore\t",
    "line\n\n\nbreaks\nhere\n",
    "trailing spaces   ",
    "   leading spaces",
    "\n",
    "  \n  \n",
    "\r\nwindows\r\nline endings\r\n",
    " \t \n x \t\n\ty",
    "    indented code\n\tand a tab\n        deeper",
    "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890 12345678901234567890",
    "3.14159 2.71828 1,000,000 1.000.000,00 -42 +7 0x1F 1e-9 v2.5.1",
    "In 2024, 37% of 1500 people paid $19.99 for 3 items.",
    "\u0663\u0664\u0665 and \u0968\u0966\u0968\u096a and \u2460\u2461\u2462 and \u216b and \xbd and \u00b2",
    "\U0001F44D",
    "\U0001F44D\U0001F3FD thumbs with a skin tone \U0001F44B\U0001F3FF\U0001F44B\U0001F3FB",
    "family \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 ZWJ sequence",
    "flags \U0001F1EF\U0001F1F5\U0001F1EB\U0001F1F7 and \U0001F3F3\uFE0F\u200D\U0001F308",
    "I \u2764\uFE0F \U0001F355!! \U0001F600\U0001F603\U0001F604 \U0001F914?",
    "\u673a\u5668\u5b66\u4e60\u662f\u4eba\u5de5\u667a\u80fd\u7684\u4e00\u4e2a\u5206\u652f\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca\u3082\u3002",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4.",
    "\u4e2d\u6587\uff0c\u6807\u70b9\uff01\u300c\u5f15\u53f7\u300d\uff1f\u554a",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0627\u0644\u0644\u063a\u0629 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u062c\u0645\u064a\u0644\u0629.",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092e\u0947\u0902 \u0932\u093f\u0916\u093e \u0917\u092f\u093e "
    "\u0935\u093e\u0915\u094d\u092f\u0964",
    "caf\u00e9 vs cafe\u0301",
    "\u00c5ngstr\u00f6m vs A\u030angstro\u0308m",
    "Vi\u00ea\u0323t Nam vs Vie\u0323\u0302t Nam and \u1ec7",
    "Hangul \uac00 vs \u1100\u1161",
    "Zalgo: Z\u0351\u0358a\u034c\u0321l\u0335g\u0337o\u0336",
    "ma\u00f1ana pi\u00f1a n\u0303",
    "Tokyo \u6771\u4eac \u0422\u043e\u043a\u0438\u043e \u0637\u0648\u0643\u064a\u0648 "
    "\u091f\u094b\u0915\u094d\u092f\u094b",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0413\u0435\u0439\u0430 "
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e44\u0e21\u0e48\u0e21\u0e35"
    "\u0e0a\u0e48\u0e2d\u0e07\u0e27\u0e48\u0e32\u0e07",
    "supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis",
    "\u4eba\u5de5\u667a\u80fd" * 12,
    "no\u00a0break space, ideographic\u3000space, em\u2003space, thin\u2009space",
    "private \ue000 use and symbols \u2211 \u222b \u221e \u2260 \u2264 \u00a9 \u00ae \u2122 \u20ac \u00a3 \u00a5",
    "...!!!??? --- === *** ### @@@ ~~~ ^^^",
    "\u2014\u2013- \u00abquoted\u00bb \u201esmart\u201c \u2039single\u203a",
    "def f(x):\n    return x + 1\n",
    "if (a && b) { c++; } else { d -= 2; }",
    "#include <vector>\nint main() { return 0; }",
    "x = [1, 2, 3]  # a list\ny = {'k': \"v\"}",
    "https://example.com/path?q=1&r=2#frag",
    "foo_bar_baz = FooBar() ; snake_case camelCase PascalCase SCREAMING_CASE",
    "email@example.com <user@host.org>",
    "Hello<|endoftext|>world",
    "x <|endoftext|> y",
    "<|endoftext|><|endoftext|>",
    "<|endoftext|>",
    "<|endoftext",
    "<|endoftext|",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>",
    "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant"
    "<|end_header_id|>\n\n4<|eot_id|><|end_of_text|>",
    "<|reserved_special_token_0|><|reserved_special_token_1|>mid<|reserved_special_token_3|>",
    "<s>Hello</s> <s> spaced </s>",
    "<unk> as text",
    "fill the <mask> here and   <mask>there",
    "call <tool_call>{\"name\": \"f\"}</tool_call> done",
    "<tool_call>",
    "tokenization tokenizer tokenized Tokenization",
    "The transformer architecture uses attention.",
    "\U0001F600 \u4f60\u597d <|endoftext|> \u0645\u0631\u062d\u0628\u0627 123456 don't\n\n",
]

# ----------------------------------------------------------------------------------------------------------
# The training corpus: the cases plus synthetic prose, code and multilingual text from a fixed generator.

WORDS = """the of and to in is was for on that with as by at from it this be are an or have not which one
all were they but had has their there been more when who will would can about other into some time only
new these two may first then any like than also such its out most over used between many where system
model data training language learning token tokens tokenizer tokenization text word words number people
after world state made through years well work water part called government known each city during both
later three under while since however year high including several large example small long group day
network attention transformer layer layers weights gradient loss batch sequence vocabulary merge merges
quick brown fox jumps lazy dog river mountain history science music river library morning weather""".split()
CODE = ["def {w}(x):\n    return x + {n}\n", "for i in range({n}):\n    total += {w}[i]\n",
        "if {w} == {n}:\n\tprint('{w}')\n", "class {W}:\n    pass\n", "// {w} {n}\nint {w} = {n};\n",
        "const {w} = [{n}, {n}];\n"]
CJK = "\u7684\u4e00\u662f\u4e0d\u4e86\u4eba\u6211\u5728\u6709\u4ed6\u8fd9\u4e2d\u5927\u6765\u4e0a\u56fd" \
      "\u4e2a\u5230\u8bf4\u4eec\u4e3a\u5b50\u548c\u4f60\u5730\u51fa\u9053\u4e5f\u65f6\u5e74\u673a\u5668" \
      "\u5b66\u4e60\u667a\u80fd\u5de5\u8bed\u8a00\u6a21\u578b\u6570\u636e"
OTHER = ["\u043f\u0440\u0438\u0432\u0435\u0442", "\u043c\u0438\u0440", "\u044f\u0437\u044b\u043a",
         "\u0434\u0430\u043d\u043d\u044b\u0435", "\u0645\u0631\u062d\u0628\u0627",
         "\u0627\u0644\u0639\u0627\u0644\u0645", "\u0644\u063a\u0629", "\u0928\u092e\u0938\u094d\u0924\u0947",
         "\u0926\u0941\u0928\u093f\u092f\u093e", "\u092d\u093e\u0937\u093e", "caf\u00e9", "na\u00efve",
         "\u00fcber", "\u00e9t\u00e9", "\u03bb\u03cc\u03b3\u03bf\u03c2", "\U0001F600", "\U0001F44D"]


class XorShift:
    """xorshift64*: a fixed generator, so the corpus never depends on Python's random module."""

    def __init__(self, seed):
        self.s = seed

    def next(self):
        s = self.s
        s ^= (s >> 12)
        s ^= (s << 25) & 0xFFFFFFFFFFFFFFFF
        s ^= (s >> 27)
        self.s = s
        return (s * 0x2545F4914F6CDD1D) & 0xFFFFFFFFFFFFFFFF

    def below(self, n):
        return (self.next() >> 11) % n


def training_text():
    rng = XorShift(0x9E3779B97F4A7C15)
    out = CASES * 3
    for _ in range(1800):
        kind = rng.below(10)
        if kind < 6:
            n = 5 + rng.below(12)
            ws = [WORDS[rng.below(len(WORDS))] for _ in range(n)]
            ws[0] = ws[0].capitalize()
            if rng.below(4) == 0:
                ws.insert(rng.below(n), str(rng.below(100000)))
            if rng.below(5) == 0:
                ws.insert(rng.below(n), OTHER[rng.below(len(OTHER))])
            out.append(" ".join(ws) + ".,;!?"[rng.below(5)] + ("\n" if rng.below(3) == 0 else " "))
        elif kind < 8:
            w = WORDS[rng.below(len(WORDS))]
            out.append(CODE[rng.below(len(CODE))].format(w=w, W=w.capitalize(), n=rng.below(1000)))
        else:
            out.append("".join(CJK[rng.below(len(CJK))] for _ in range(4 + rng.below(20))) + "\u3002")
    return "".join(out)


# ----------------------------------------------------------------------------------------------------------
# Training: the most frequent adjacent pair is merged, repeatedly (ties: the smallest pair), with pair
# counts updated incrementally.

def train_merges(word_freqs, n_merges, mergeable=lambda s: True):
    words = [list(w) for w in word_freqs]
    freqs = list(word_freqs.values())
    counts, where = {}, {}
    for i, w in enumerate(words):
        for p in zip(w, w[1:]):
            if mergeable(p[0]) and mergeable(p[1]):
                counts[p] = counts.get(p, 0) + freqs[i]
                where.setdefault(p, set()).add(i)
    heap = [(-c, p) for p, c in counts.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < n_merges and heap:
        neg, pair = heapq.heappop(heap)
        if counts.get(pair, 0) != -neg or neg == 0:
            continue
        merges.append(pair)
        a, b = pair
        changed = set()
        for i in sorted(where.pop(pair, ())):
            w, f = words[i], freqs[i]
            nw, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    nw.append(a + b)
                    j += 2
                else:
                    nw.append(w[j])
                    j += 1
            if len(nw) == len(w):
                continue
            for p in zip(w, w[1:]):
                if p in counts:
                    counts[p] -= f
                    changed.add(p)
            for p in zip(nw, nw[1:]):
                if mergeable(p[0]) and mergeable(p[1]):
                    counts[p] = counts.get(p, 0) + f
                    where.setdefault(p, set()).add(i)
                    changed.add(p)
            words[i] = nw
        counts.pop(pair, None)
        for p in sorted(changed):
            if counts.get(p, 0) > 0:
                heapq.heappush(heap, (-counts[p], p))
    return merges


def added(id_, content, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def byte_level_family(name, pattern, merges_n, specials, normalizer=None, pair_merges=True,
                      ignore_merges=False, extra_words=(), gpt2=False):
    """A byte-level BPE tokenizer.json (dict) trained on the corpus with the family's pre-tokenization."""
    text = training_text()
    for s in specials:
        text = text.replace(s["content"], " ")
    if normalizer == "NFC":
        text = unicodedata.normalize("NFC", text)
    compiled = regex.compile(pattern)
    freqs = {}
    for m in compiled.finditer(text):
        w = tuple(BYTE_ENCODER[b] for b in m.group().encode("utf-8"))
        freqs[w] = freqs.get(w, 0) + 1
    merges = train_merges(freqs, merges_n)
    vocab = {}
    for c in BYTE_ENCODER.values():
        vocab[c] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    for w in extra_words:
        vocab.setdefault("".join(BYTE_ENCODER[b] for b in w.encode("utf-8")), len(vocab))
    tokens = []
    for s in specials:
        s = dict(s, id=len(vocab) + len(tokens))
        tokens.append(s)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if gpt2:
        pre = byte_level
        post = byte_level
    else:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            dict(byte_level, use_regex=False)]}
        post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    if name == "llama3":
        post = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>",
                                                      "ids": [vocab_id(tokens, "<|begin_of_text|>")],
                                                      "tokens": ["<|begin_of_text|>"]}}}]}
    model = {"type": "BPE", "dropout": None, "unk_token": None,
             "continuing_subword_prefix": "" if gpt2 else None, "end_of_word_suffix": "" if gpt2 else None,
             "fuse_unk": False, "byte_fallback": False}
    if not gpt2:
        model["ignore_merges"] = ignore_merges
    model["vocab"] = vocab
    model["merges"] = [list(m) for m in merges] if pair_merges else [f"{a} {b}" for a, b in merges]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": tokens,
            "normalizer": {"type": "NFC"} if normalizer == "NFC" else None, "pre_tokenizer": pre,
            "post_processor": post, "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                                                "trim_offsets": True, "use_regex": True},
            "model": model}


def vocab_id(tokens, content):
    return next(t["id"] for t in tokens if t["content"] == content)


def bytefallback_family(merges_n=800, chars_n=160):
    text = training_text()
    for s in ("<unk>", "<s>", "</s>"):
        text = text.replace(s, " ")
    text = "\u2581" + text.replace(" ", "\u2581")
    counts = {}
    for c in text:
        counts[c] = counts.get(c, 0) + 1
    chars = [c for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if n >= 3][:chars_n]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for c in chars:
        vocab.setdefault(c, len(vocab))
    freqs = {}
    for w in regex.findall(r"\u2581*[^\u2581]+|\u2581+", text):
        syms = []
        for c in w:
            syms += [c] if c in vocab else ["<0x%02X>" % b for b in c.encode("utf-8")]
        freqs[tuple(syms)] = freqs.get(tuple(syms), 0) + 1
    merges = train_merges(freqs, merges_n, mergeable=lambda s: not s.startswith("<0x"))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tokens = [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": tokens,
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "\u2581"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
            "pre_tokenizer": None,
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}},
                                        {"SpecialToken": {"id": "<s>", "type_id": 1}},
                                        {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                      "ignore_merges": False, "vocab": vocab, "merges": [list(m) for m in merges]}}


def families():
    return {
        "gpt2": byte_level_family(
            "gpt2", GPT2_PATTERN, 2000, [added(0, "<|endoftext|>", normalized=True),
                                         added(0, "<mask>", lstrip=True)], pair_merges=False, gpt2=True),
        "llama3": byte_level_family(
            "llama3", LLAMA3_PATTERN, 2000,
            [added(0, c) for c in ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                                   "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>",
                                   "<|reserved_special_token_2|>", "<|reserved_special_token_3|>", "<|eot_id|>")],
            ignore_merges=True,
            extra_words=(" tokenization", " transformer", " architecture", "Tokenization", "tokenizer",
                         " attention", " supercalifragilisticexpialidocious")),
        "qwen2": byte_level_family(
            "qwen2", QWEN2_PATTERN, 2000,
            [added(0, "<|endoftext|>"), added(0, "<|im_start|>"), added(0, "<|im_end|>"),
             added(0, "<tool_call>", special=False), added(0, "</tool_call>", special=False)],
            normalizer="NFC"),
        "bytefallback": bytefallback_family(),
    }


# ----------------------------------------------------------------------------------------------------------
# Output: stable JSON, one vocabulary entry, merge or case per line so the fixtures diff well.

def dump(v):
    return json.dumps(v, ensure_ascii=False)


def tokenizer_json(t):
    lines = ["{"]
    keys = list(t)
    for k in keys:
        end = "," if k != keys[-1] else ""
        if k == "model":
            lines.append('  "model": {')
            mkeys = list(t["model"])
            for mk in mkeys:
                mend = "," if mk != mkeys[-1] else ""
                v = t["model"][mk]
                if mk == "vocab":
                    items = list(v.items())
                    lines.append('    "vocab": {')
                    lines += [f"      {dump(p)}: {i}" + ("," if n + 1 < len(items) else "")
                              for n, (p, i) in enumerate(items)]
                    lines.append("    }" + mend)
                elif mk == "merges":
                    lines.append('    "merges": [')
                    lines += [f"      {dump(m)}" + ("," if n + 1 < len(v) else "") for n, m in enumerate(v)]
                    lines.append("    ]" + mend)
                else:
                    lines.append(f"    {dump(mk)}: {dump(v)}{mend}")
            lines.append("  }" + end)
        elif k == "added_tokens":
            lines.append('  "added_tokens": [')
            lines += [f"    {dump(x)}" + ("," if n + 1 < len(t[k]) else "") for n, x in enumerate(t[k])]
            lines.append("  ]" + end)
        else:
            lines.append(f"  {dump(k)}: {dump(t[k])}{end}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def generate(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "cases.json"), "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join("  " + dump(c) for c in CASES) + "\n]\n")
    for name, spec in families().items():
        path = os.path.join(out_dir, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(tokenizer_json(spec))
        ref = Reference(path)
        ids = [ref.encode(c) for c in CASES]
        decoded = [ref.decode(i) for i in ids]
        if name != "bytefallback":  # byte-level BPE gives the (normalized) text back, bar lstrip's spaces
            for c, d in zip(CASES, decoded):
                want = unicodedata.normalize("NFC", c) if name == "qwen2" else c
                assert d == want or (name == "gpt2" and "<mask>" in c), (name, c, d)
        with open(path, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        lines = ["{", f'  "tokenizer": {dump(name + ".json")},', f'  "sha256": {dump(sha)},', '  "cases": [']
        lines += ["    " + dump({"ids": i, "decoded": d}) + ("," if n + 1 < len(ids) else "")
                  for n, (i, d) in enumerate(zip(ids, decoded))]
        lines += ["  ]", "}"]
        with open(os.path.join(out_dir, name + ".expected.json"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{name}: {len(spec['model']['vocab'])} pieces, {len(spec['model']['merges'])} merges, "
              f"{sum(map(len, ids))} ids over {len(CASES)} cases")


def check(dir_):
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp)
        bad = 0
        for name in sorted(os.listdir(tmp)):
            with open(os.path.join(tmp, name), "rb") as a:
                want = a.read()
            try:
                with open(os.path.join(dir_, name), "rb") as b:
                    got = b.read()
            except FileNotFoundError:
                got = None
            if got != want:
                print(f"check: {name} differs from a fresh generation", file=sys.stderr)
                bad += 1
        return 1 if bad else 0


def bench(tokenizer, text_file):
    ref = Reference(tokenizer)
    ref.cache = {}
    with open(text_file, encoding="utf-8") as f:
        lines = f.read().split("\n")
    n_bytes = sum(len(line.encode("utf-8")) for line in lines)
    start = time.process_time()
    tokens = 0
    for line in lines:
        tokens += len(ref.encode(line))
    seconds = time.process_time() - start
    print(json.dumps({"bytes": n_bytes, "tokens": tokens, "cpu_seconds": seconds,
                      "mb_per_s": n_bytes / 1e6 / max(seconds, 1e-9)}))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_dir = os.path.normpath(os.path.join(here, "..", "fixtures", "hf_tokenizers"))
    cmd = sys.argv[1] if len(sys.argv) > 1 else "generate"
    if cmd == "generate":
        generate(sys.argv[2] if len(sys.argv) > 2 else default_dir)
    elif cmd == "check":
        sys.exit(check(sys.argv[2] if len(sys.argv) > 2 else default_dir))
    elif cmd == "bench" and len(sys.argv) == 4:
        bench(sys.argv[2], sys.argv[3])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(64)


if __name__ == "__main__":
    main()
