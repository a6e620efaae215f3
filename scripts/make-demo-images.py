#!/usr/bin/env python3
"""Renders the demo's image-text set: pictures of coloured shapes drawn on this machine (no downloads; the
same seed gives the same files), with questions about their colour, shape, count and position.

Usage: scripts/make-demo-images.py OUT_DIR [PICTURES]

Writes OUT_DIR/img/*.png and *.jpg, OUT_DIR/train.jsonl (a caption or a question per picture, the input of
`forge-data prepare --format image-text`, docs/DATA.md "Image-text data"), OUT_DIR/heldout.jsonl (held-out
pictures with a question and its answer, given to prepare as --eval-set so that no training picture is a near
copy of one) and the same questions as the gate's vqa suite OUT_DIR/suites/shapes (suite.json, tasks.jsonl).
Needs python3-pil.
"""
import json
import os
import random
import sys

from PIL import Image, ImageDraw

COLOURS = {"red": (210, 40, 40), "green": (40, 170, 70), "blue": (50, 70, 210), "yellow": (225, 200, 40)}
SHAPES = ("circle", "square", "triangle")
WORDS = {1: "one", 2: "two", 3: "three"}


def render(rng, path):
    """A picture of 1-3 shapes of one colour and kind in one half; returns what a question can ask.

    The picture is a 4 x 4 grid of cells and each shape sits inside a cell of its half, a little off its
    centre and of varying size: fitted to the demo's 32 pixels the cells are its encoder's 8-pixel patches,
    so a patch sees a whole shape or none (a from-scratch tower learns that in minutes; shapes cut across
    patches take it far longer)."""
    colour, shape, count = rng.choice(list(COLOURS)), rng.choice(SHAPES), rng.randint(1, 3)
    side = rng.choice(("left", "right"))
    cell = 16
    background = tuple(rng.randint(215, 250) for _ in range(3))
    im = Image.new("RGB", (4 * cell, 4 * cell), background)
    draw = ImageDraw.Draw(im)
    columns = (0, 1) if side == "left" else (2, 3)
    for c in rng.sample([(x, y) for x in columns for y in range(4)], count):
        size = rng.randint(10, 14)
        x0 = c[0] * cell + rng.randint(1, cell - size - 1)
        y0 = c[1] * cell + rng.randint(1, cell - size - 1)
        box = [x0, y0, x0 + size - 1, y0 + size - 1]
        if shape == "circle":
            draw.ellipse(box, fill=COLOURS[colour])
        elif shape == "square":
            draw.rectangle(box, fill=COLOURS[colour])
        else:
            draw.polygon([(x0, y0 + size - 1), (x0 + size - 1, y0 + size - 1), (x0 + size // 2, y0)],
                         fill=COLOURS[colour])
    im.save(path, quality=90) if path.endswith(".jpg") else im.save(path)
    return colour, shape, count, side


OPTIONS = {"colour": list(COLOURS), "shape": list(SHAPES), "count": list(WORDS.values()), "side": ["left", "right"]}
QUESTIONS = {"colour": "What colour are the shapes?", "shape": "What shape is drawn?",
             "count": "How many shapes are there?", "side": "On which side are the shapes?"}


def question(rng, facts):
    """A question about the picture (its kind, text and answer) and the picture's caption."""
    colour, shape, count, side = facts
    plural = shape + ("s" if count > 1 else "")
    kind = rng.choice(list(QUESTIONS))
    answer = {"colour": colour, "shape": shape, "count": WORDS[count], "side": side}[kind]
    return (kind, QUESTIONS[kind], answer), f"{WORDS[count]} {colour} {plural} on the {side}"


def write_suite(out, name, settings, tasks):
    suite = os.path.join(out, "suites", name)
    os.makedirs(suite, exist_ok=True)
    with open(os.path.join(suite, "suite.json"), "w") as f:
        json.dump({"name": name, **settings}, f)
    with open(os.path.join(suite, "tasks.jsonl"), "w") as f:
        f.writelines(json.dumps({"id": f"{name}-{i}", **t}) + "\n" for i, t in enumerate(tasks))


def main():
    out = sys.argv[1]
    pictures = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    rng = random.Random(44)
    os.makedirs(os.path.join(out, "img"), exist_ok=True)
    train, heldout = [], []
    for i in range(pictures):
        name = f"img/{i:04d}.{'jpg' if i % 3 == 0 else 'png'}"
        facts = render(rng, os.path.join(out, name))
        (kind, q, a), caption = question(rng, facts)
        if i % 10 == 9:  # every tenth picture is held out
            heldout.append({"image": name, "prompt": q, "answer": a, "kind": kind, "caption": caption})
        elif i % 2 == 0:
            train.append({"image": name, "text": f"A picture of {caption}.", "domain": "captions"})
        else:
            messages = [{"role": "user", "content": f"<image>\n{q}"}, {"role": "assistant", "content": a}]
            train.append({"image": name, "messages": messages, "domain": "questions"})
    with open(os.path.join(out, "train.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in train)
    with open(os.path.join(out, "heldout.jsonl"), "w") as f:
        f.writelines(json.dumps({k: r[k] for k in ("image", "prompt", "answer")}) + "\n" for r in heldout)
    # The held-out pictures as three gate suites (paths relative to each suite's directory): a short answer
    # generated and matched (vqa), the same questions' options ranked by likelihood (multiple choice), and a
    # generated caption scored against the picture's (caption, CIDEr-D).
    picture = lambda r: "../../" + r["image"]
    write_suite(out, "shapes", {"type": "vqa", "max_new_tokens": 16,
                                "description": "colour, shape, count and side of the held-out pictures' shapes"},
                [{"prompt": f"<image>\n{r['prompt']}", "image": picture(r), "answer": r["answer"], "kind": r["kind"]}
                 for r in heldout])
    write_suite(out, "shapes-choice", {"type": "multiple_choice",
                                       "description": "the same questions, their options ranked by likelihood"},
                [{"prompt": f"<image>\n{r['prompt']}", "image": picture(r), "choices": OPTIONS[r["kind"]],
                  "answer": OPTIONS[r["kind"]].index(r["answer"]), "kind": r["kind"]} for r in heldout])
    write_suite(out, "shapes-captions", {"type": "caption", "max_new_tokens": 24,
                                         "description": "a caption of each held-out picture, CIDEr-D"},
                [{"prompt": "<image>", "image": picture(r), "references": [f"A picture of {r['caption']}."]}
                 for r in heldout])
    chance = sum(1 / len(OPTIONS[r["kind"]]) for r in heldout) / max(1, len(heldout))
    print(f"make-demo-images: {pictures} pictures, {len(train)} training records, {len(heldout)} held out "
          f"(chance on their questions: {chance:.3f})")


if __name__ == "__main__":
    main()
