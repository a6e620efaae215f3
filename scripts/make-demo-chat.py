#!/usr/bin/env python3
"""Builds the demo's chat set from the demo corpus's man pages (scripts/make-demo-corpus.sh docs/): no
downloads, the same machine gives the same set.

Usage: scripts/make-demo-chat.py DOCS_DIR OUT.jsonl [PAIRS.jsonl]

Every page gives a conversation about its command (what it is for, then more detail) and one per option it
documents (what the option does); every third has a system turn. The replies are the page's own words, so a
model fine-tuned on them learns to answer in the pages' terms. Output: JSONL records {"messages": [{"role",
"content"}, ...]}, the input of `forge-data prepare --format chat` (docs/DATA.md, "Chat data"). With
PAIRS.jsonl, also preference pairs for `--format preference`: each conversation's last question with its own
reply as the chosen one and the same words out of order as the rejected one (a preference for fluent
answers, which a small model can learn and carry over to held-out pairs).
"""
import json
import os
import random
import re
import sys

SYSTEM = "You answer questions about the commands of this machine, in the words of their manual pages."


def sections(lines):
    """The page's lines under each upper-case heading (NAME, SYNOPSIS, DESCRIPTION, OPTIONS, ...)."""
    out, current = {}, None
    for line in lines:
        if re.fullmatch(r"[A-Z][A-Z ]+", line.strip()):
            current = line.strip()
            out.setdefault(current, [])
        elif current:
            out[current].append(line.strip())
    return out


def sentence(text, limit):
    """The text up to its first full stop after 40 characters, at most `limit` characters."""
    text = re.sub(r"\s+", " ", text).strip()
    stop = text.find(". ", 40)
    if 0 < stop < limit:
        return text[: stop + 1]
    return text[:limit].rstrip() + ("" if text[:limit].endswith(".") else ".")


def conversations(page):
    lines = page.splitlines()
    s = sections(lines)
    name = next((l for l in s.get("NAME", []) if " - " in l), None)
    if not name:
        return []
    command, purpose = (x.strip() for x in name.split(" - ", 1))
    command = command.split(",")[0].strip()
    if not command or not purpose:
        return []
    body = s.get("DESCRIPTION", []) + s.get("OPTIONS", [])
    detail = " ".join(l for l in body if l and not l.startswith("-"))
    out = []
    turns = [("user", f"What is {command} for?"), ("assistant", f"{command}: {purpose}.")]
    if len(detail) > 60:
        turns += [("user", f"Tell me more about {command}."), ("assistant", sentence(detail, 300))]
    out.append(turns)
    for i, line in enumerate(body[:-1]):
        option, meaning = line.split(" ")[0], body[i + 1]
        if re.fullmatch(r"--?[A-Za-z][-A-Za-z0-9]*", option) and meaning and not meaning.startswith("-"):
            out.append([("user", f"What does {option} do in {command}?"), ("assistant", sentence(meaning, 200))])
        if len(out) > 8:
            break
    return out


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: make-demo-chat.py DOCS_DIR OUT.jsonl [PAIRS.jsonl]")
    docs, out_path = sys.argv[1:3]
    n = 0
    convs = []
    with open(out_path, "w", encoding="utf-8") as out:
        for name in sorted(os.listdir(docs)):
            with open(os.path.join(docs, name), encoding="utf-8", errors="replace") as f:
                page = f.read()
            for turns in conversations(page):
                messages = [{"role": "system", "content": SYSTEM}] if n % 3 == 0 else []
                messages += [{"role": r, "content": c} for r, c in turns]
                out.write(json.dumps({"messages": messages}) + "\n")
                convs.append(messages)
                n += 1
    if n == 0:
        sys.exit(f"make-demo-chat.py: no manual page in {docs} gave a conversation")
    print(f"{n} conversations from {docs} -> {out_path}")
    if len(sys.argv) == 4:
        pairs = 0
        with open(sys.argv[3], "w", encoding="utf-8") as out:
            for i, m in enumerate(convs):
                words = m[-1]["content"].split()
                random.Random(i).shuffle(words)
                scrambled = " ".join(words)
                if scrambled != " ".join(m[-1]["content"].split()):
                    out.write(json.dumps({"prompt": m[:-1], "chosen": m[-1]["content"], "rejected": scrambled}) + "\n")
                    pairs += 1
        print(f"{pairs} preference pairs -> {sys.argv[3]}")


if __name__ == "__main__":
    main()
