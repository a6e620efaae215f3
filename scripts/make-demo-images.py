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
    """A picture of 1-3 shapes of one colour and kind in one half; returns what a question can ask."""
    colour, shape, count = rng.choice(list(COLOURS)), rng.choice(SHAPES), rng.randint(1, 3)
    side = rng.choice(("left", "right"))
    width, height = rng.choice(((96, 64), (80, 80), (64, 96)))
    background = tuple(rng.randint(215, 250) for _ in range(3))
    im = Image.new("RGB", (width, height), background)
    draw = ImageDraw.Draw(im)
    size = min(width, height) // 4
    for k in range(count):
        x0 = (0 if side == "left" else width // 2) + rng.randint(0, width // 2 - size - 1)
        y0 = k * (height // count) + rng.randint(0, max(0, height // count - size - 1))
        box = [x0, y0, x0 + size, y0 + size]
        if shape == "circle":
            draw.ellipse(box, fill=COLOURS[colour])
        elif shape == "square":
            draw.rectangle(box, fill=COLOURS[colour])
        else:
            draw.polygon([(x0, y0 + size), (x0 + size, y0 + size), (x0 + size // 2, y0)], fill=COLOURS[colour])
    im.save(path, quality=90) if path.endswith(".jpg") else im.save(path)
    return colour, shape, count, side


def question(rng, facts):
    colour, shape, count, side = facts
    plural = shape + ("s" if count > 1 else "")
    return rng.choice(
        (
            ("What colour are the shapes?", colour),
            ("What shape is drawn?", shape),
            ("How many shapes are there?", WORDS[count]),
            ("On which side are the shapes?", side),
        )
    ), f"{WORDS[count]} {colour} {plural} on the {side}"


def main():
    out = sys.argv[1]
    pictures = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    rng = random.Random(44)
    os.makedirs(os.path.join(out, "img"), exist_ok=True)
    train, heldout = [], []
    for i in range(pictures):
        name = f"img/{i:04d}.{'jpg' if i % 3 == 0 else 'png'}"
        facts = render(rng, os.path.join(out, name))
        (q, a), caption = question(rng, facts)
        if i % 10 == 9:  # every tenth picture is held out
            heldout.append({"image": name, "prompt": q, "answer": a})
        elif i % 2 == 0:
            train.append({"image": name, "text": f"A picture of {caption}.", "domain": "captions"})
        else:
            messages = [{"role": "user", "content": f"<image>\n{q}"}, {"role": "assistant", "content": a}]
            train.append({"image": name, "messages": messages, "domain": "questions"})
    for name, records in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        with open(os.path.join(out, name), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    suite = os.path.join(out, "suites", "shapes")
    os.makedirs(suite, exist_ok=True)
    with open(os.path.join(suite, "suite.json"), "w") as f:
        json.dump({"name": "shapes", "type": "vqa", "max_new_tokens": 16,
                   "description": "colour, shape, count and side of the held-out pictures' shapes"}, f)
    with open(os.path.join(suite, "tasks.jsonl"), "w") as f:
        for i, r in enumerate(heldout):
            task = {"id": f"shapes-{i}", "prompt": f"<image>\n{r['prompt']}", "image": "../../" + r["image"],
                    "answer": r["answer"]}
            f.write(json.dumps(task) + "\n")
    print(f"make-demo-images: {pictures} pictures, {len(train)} training records, {len(heldout)} held out")


if __name__ == "__main__":
    main()
