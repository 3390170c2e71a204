"""Write the math word problems of examples/laptop_math: train.jsonl and heldout.jsonl.

    python examples/laptop_math/make_problems.py            # into examples/laptop_math/
    python examples/laptop_math/make_problems.py --out DIR --train 2000 --heldout 200 --seed 0

Each row is {"prompt": ..., "answer": "<integer>", "kind": ...}: a one- or two-step story
problem over small whole numbers (adding, taking away, groups of, sharing equally, two steps),
with the instruction to end with "The answer is <number>." Nothing is downloaded: the problems
come from templates, names and objects below, drawn with a seeded generator, so the files are
the same on every machine. The held-out problems use the same templates with other draws, and
no held-out prompt is also a training prompt.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

INSTRUCTION = "Solve the problem. End with 'The answer is <number>.'"

NAMES = ["Ava", "Ben", "Chloe", "Dan", "Emma", "Finn", "Grace", "Hugo", "Isla", "Jack", "Kate", "Leo",
         "Mia", "Noah", "Olga", "Paul", "Rosa", "Sam", "Tara", "Umar", "Vera", "Will", "Yara", "Zoe"]
THINGS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "coins", "shells", "cards",
          "stamps", "eggs", "balloons", "buttons", "oranges", "toy cars", "flowers"]
BOXES = ["boxes", "bags", "baskets", "jars", "packs", "rows", "shelves", "trays"]


def _add(r: random.Random) -> tuple[str, int]:
    n, t, a, b = r.choice(NAMES), r.choice(THINGS), r.randint(2, 12), r.randint(2, 12)
    story = r.choice([
        f"{n} has {a} {t}. {n} gets {b} more {t}. How many {t} does {n} have now?",
        f"There are {a} {t} on a table and someone puts {b} more {t} on it. How many {t} are on the table?",
        f"{n} collected {a} {t} on Monday and {b} {t} on Tuesday. How many {t} did {n} collect in all?",
    ])
    return story, a + b


def _sub(r: random.Random) -> tuple[str, int]:
    n, t = r.choice(NAMES), r.choice(THINGS)
    a = r.randint(4, 20)
    b = r.randint(1, a - 1)
    story = r.choice([
        f"{n} has {a} {t} and gives {b} of them to a friend. How many {t} does {n} have left?",
        f"A jar holds {a} {t}. {n} takes {b} {t} out of the jar. How many {t} are still in the jar?",
        f"{n} had {a} {t} and lost {b} of them. How many {t} does {n} have now?",
    ])
    return story, a - b


def _groups(r: random.Random) -> tuple[str, int]:
    n, t, box = r.choice(NAMES), r.choice(THINGS), r.choice(BOXES)
    a, b = r.randint(2, 5), r.randint(2, 5)
    story = r.choice([
        f"{n} has {a} {box} with {b} {t} in each. How many {t} does {n} have?",
        f"There are {a} {box} and each holds {b} {t}. How many {t} are there altogether?",
    ])
    return story, a * b


def _share(r: random.Random) -> tuple[str, int]:
    n, t = r.choice(NAMES), r.choice(THINGS)
    each, k = r.randint(2, 5), r.randint(2, 4)
    story = r.choice([
        f"{n} shares {each * k} {t} equally among {k} friends. How many {t} does each friend get?",
        f"{each * k} {t} are put into {k} equal piles. How many {t} are in each pile?",
    ])
    return story, each


def _two_steps(r: random.Random) -> tuple[str, int]:
    n, t = r.choice(NAMES), r.choice(THINGS)
    a, b = r.randint(3, 12), r.randint(2, 8)
    c = r.randint(1, a + b - 1)
    story = r.choice([
        f"{n} has {a} {t}, buys {b} more, then gives away {c}. How many {t} does {n} have now?",
        f"A shop has {a} {t}. It gets {b} more and sells {c}. How many {t} does the shop have left?",
    ])
    return story, a + b - c


KINDS = {"add": _add, "sub": _sub, "groups": _groups, "share": _share, "two_steps": _two_steps}


def problems(count: int, rng: random.Random, avoid: set[str] = frozenset()) -> list[dict]:
    rows, seen = [], set(avoid)
    kinds = list(KINDS)
    while len(rows) < count:
        kind = kinds[len(rows) % len(kinds)]  # the kinds in turn: every split has them in equal parts
        story, answer = KINDS[kind](rng)
        if story in seen:
            continue
        seen.add(story)
        rows.append({"prompt": f"{story}\n{INSTRUCTION}", "answer": str(answer), "kind": kind})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.train < 1 or args.heldout < 1:
        ap.error("--train and --heldout must be at least 1")
    rng = random.Random(args.seed)
    heldout = problems(args.heldout, rng)
    train = problems(args.train, rng, avoid={r["prompt"].split("\n")[0] for r in heldout})
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        with open(args.out / name, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        print(f"{args.out / name}: {len(rows)} problems")


if __name__ == "__main__":
    main()
