"""GSM8K-format synthetic word problems for tests, the tiny tokenizer and the offline demo.

Each problem is a dict with the same fields as the `openai/gsm8k` dataset: `question` and `answer`, where the
answer holds worked steps with GSM8K's `<<expr=value>>` calculator annotations and ends with `#### N`.
Generation is deterministic for a given seed, so a dataset written on every worker is identical.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

_NAMES = ["Ava", "Ben", "Carla", "Dev", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jamal", "Kira", "Liam",
          "Maya", "Noah", "Olga", "Pablo", "Quinn", "Rosa", "Sam", "Tariq"]
_ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "shells", "cards", "eggs",
          "flowers"]
_CONTAINERS = ["boxes", "bags", "baskets", "crates", "jars"]


def _buy_and_spend(rng: random.Random) -> tuple[str, str]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    count, price = rng.randint(2, 12), rng.randint(2, 9)
    cost = count * price
    wallet = cost + rng.randint(1, 40)
    left = wallet - cost
    question = (f"{name} has ${wallet}. {name} buys {count} {item} that cost ${price} each. "
                f"How many dollars does {name} have left?")
    answer = (f"The {item} cost {count} * {price} = <<{count}*{price}={cost}>>{cost} dollars.\n"
              f"{name} has {wallet} - {cost} = <<{wallet}-{cost}={left}>>{left} dollars left.\n#### {left}")
    return question, answer


def _containers(rng: random.Random) -> tuple[str, str]:
    name, item, box = rng.choice(_NAMES), rng.choice(_ITEMS), rng.choice(_CONTAINERS)
    boxes, per_box, extra = rng.randint(2, 9), rng.randint(3, 15), rng.randint(1, 20)
    packed = boxes * per_box
    total = packed + extra
    question = (f"{name} has {boxes} {box} with {per_box} {item} in each, "
                f"and {extra} more {item} on the table. "
                f"How many {item} does {name} have in total?")
    answer = (f"In the {box} there are {boxes} * {per_box} = <<{boxes}*{per_box}={packed}>>{packed} {item}.\n"
              f"In total {name} has {packed} + {extra} = <<{packed}+{extra}={total}>>{total} {item}.\n"
              f"#### {total}")
    return question, answer


def _share(rng: random.Random) -> tuple[str, str]:
    a, b = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    friends, each, kept = rng.randint(2, 8), rng.randint(2, 12), rng.randint(1, 15)
    given = friends * each
    total = given + kept
    question = (f"{a} gave {each} {item} to each of {friends} friends, including {b}, "
                f"and kept {kept} {item}. "
                f"How many {item} did {a} have at first?")
    answer = (f"{a} gave away {friends} * {each} = <<{friends}*{each}={given}>>{given} {item}.\n"
              f"At first {a} had {given} + {kept} = <<{given}+{kept}={total}>>{total} {item}.\n#### {total}")
    return question, answer


def _speed(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(_NAMES)
    speed, hours, back = rng.randint(20, 70), rng.randint(2, 6), rng.randint(1, 3)
    out = speed * hours
    back_dist = speed * back
    total = out + back_dist
    question = (f"{name} drives at {speed} miles per hour for {hours} hours, "
                f"then drives back for {back} hours "
                f"at the same speed. How many miles did {name} drive in total?")
    answer = (f"First {name} drives {speed} * {hours} = <<{speed}*{hours}={out}>>{out} miles.\n"
              f"Then {speed} * {back} = <<{speed}*{back}={back_dist}>>{back_dist} miles.\n"
              f"In total {out} + {back_dist} = <<{out}+{back_dist}={total}>>{total} miles.\n#### {total}")
    return question, answer


def _wages(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(_NAMES)
    rate, hours, days = rng.randint(8, 30), rng.randint(2, 8), rng.randint(2, 6)
    daily = rate * hours
    total = daily * days
    question = (f"{name} earns ${rate} an hour and works {hours} hours a day for {days} days. "
                f"How much money does {name} earn?")
    answer = (f"Each day {name} earns {rate} * {hours} = <<{rate}*{hours}={daily}>>{daily} dollars.\n"
              f"Over {days} days that is {daily} * {days} = <<{daily}*{days}={total}>>{total} dollars.\n"
              f"#### {total}")
    return question, answer


def _split_evenly(rng: random.Random) -> tuple[str, str]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    groups, each, eaten = rng.randint(2, 9), rng.randint(2, 12), rng.randint(1, 10)
    total = groups * each + eaten
    shared = total - eaten
    question = (f"{name} had {total} {item}, used {eaten} of them, and split the rest equally into {groups} "
                f"groups. How many {item} are in each group?")
    answer = (f"After using some, {name} had {total} - {eaten} = "
              f"<<{total}-{eaten}={shared}>>{shared} {item}.\n"
              f"Each group gets {shared} / {groups} = <<{shared}/{groups}={each}>>{each} {item}.\n"
              f"#### {each}")
    return question, answer


_TEMPLATES: list[Callable[[random.Random], tuple[str, str]]] = [
    _buy_and_spend, _containers, _share, _speed, _wages, _split_evenly,
]


def generate_problems(n: int, seed: int) -> list[dict]:
    """`n` GSM8K-format problems (`question`, `answer` ending in `#### N`), deterministic for `seed`."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    problems = []
    for _ in range(n):
        question, answer = rng.choice(_TEMPLATES)(rng)
        problems.append({"question": question, "answer": answer})
    return problems


def write_jsonl(path: str | Path, n: int, seed: int) -> Path:
    """Write `n` problems as JSON lines (the layout `datasets.load_dataset("json", ...)` reads)."""
    out = Path(path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for problem in generate_problems(n, seed):
            f.write(json.dumps(problem) + "\n")
    return out
