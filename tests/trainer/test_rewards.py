"""Reward functions on real GSM8K-style answers, and the synthetic GSM8K generator."""

from __future__ import annotations

import json
import operator
import re
from pathlib import Path

import numpy as np
import pytest

from trainer.rewards import (
    correct_reward,
    digits_reward,
    final_answer,
    format_reward,
    gold_answer,
    parse_number,
    score_batch,
    tag_count_reward,
)
from trainer.synthetic_gsm8k import generate_problems, write_jsonl

# Gold answers in the openai/gsm8k layout (worked steps with <<calc>> annotations, then "#### N").
NATALIA = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
           "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")
BIG = "The house costs 80,000 + 50,000 = <<80000+50000=130000>>130,000 dollars.\n#### 70000"
NEGATIVE = "It drops 10 - 15 = <<10-15=-5>>-5 degrees.\n#### -5"
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
DECIMAL = "Each costs 7 / 2 = <<7/2=3.5>>3.5 dollars.\n#### 3.5"


def wrap(think: str, answer: str) -> str:
    return f"<think>{think}</think>\n<answer>{answer}</answer>"


@pytest.mark.parametrize("completion, gold, expected", [
    (wrap("48/2=24, 48+24=72", "72"), NATALIA, 1.0),
    (wrap("...", "She sold 72 clips."), NATALIA, 1.0),          # units and words around the number
    (wrap("...", "$70,000"), BIG, 1.0),                        # dollar sign and thousands comma
    (wrap("...", "70000.00"), BIG, 1.0),
    (wrap("...", "The profit is $70,000."), BIG, 1.0),          # trailing period
    (wrap("...", "-5 degrees"), NEGATIVE, 1.0),
    (wrap("...", "3.5"), DECIMAL, 1.0),
    (wrap("72 clips", "71"), NATALIA, 0.0),                   # right number only in the reasoning
    (wrap("...", "130,000"), BIG, 0.0),
    (wrap("...", "no idea"), NATALIA, 0.0),
    ("The answer is 72", NATALIA, 1.0),                        # no tags: the last number of the text
    ("", NATALIA, 0.0),
    (wrap("a", "1") + wrap("b", "72"), NATALIA, 1.0),          # the last <answer> block counts
])
def test_correct_reward(completion, gold, expected):
    assert correct_reward(completion, gold) == expected


def test_gold_and_number_parsing():
    assert gold_answer(NATALIA) == "72"
    assert gold_answer(BIG) == "70000"
    assert parse_number("$1,234.50 per week") == 1234.5
    assert parse_number("about -3 or 4.") == 4.0
    assert parse_number("none") is None
    assert final_answer("x <answer> 5 </answer>") == " 5 "


def test_format_and_tag_count_rewards():
    good = wrap("Natalia sold 24 in May.\nSo 72.", "72")
    assert format_reward(good, NATALIA) == 1.0
    assert format_reward("  " + good + "\n", NATALIA) == 1.0
    assert format_reward("Sure! " + good, NATALIA) == 0.0                 # text before the tags
    assert format_reward(good + " Hope this helps", NATALIA) == 0.0      # text after
    assert format_reward("<answer>72</answer>", NATALIA) == 0.0          # no thinking block
    assert tag_count_reward(good, NATALIA) == 1.0
    assert tag_count_reward("<think>x</think> 72", NATALIA) == 0.5
    assert tag_count_reward(good + good, NATALIA) == 0.0                # every tag twice
    assert tag_count_reward("72", NATALIA) == 0.0


def test_score_batch_weights():
    completions = [wrap("...", "72"), "72", "<think>x</think> 5"]
    golds = [NATALIA] * 3
    total, per_fn = score_batch(completions, golds, {"correct": 1.0, "format": 0.5, "tag_count": 0.5})
    np.testing.assert_allclose(per_fn["correct"], [1, 1, 0])
    np.testing.assert_allclose(per_fn["format"], [1, 0, 0])
    np.testing.assert_allclose(per_fn["tag_count"], [1, 0, 0.5])
    np.testing.assert_allclose(total, [2.0, 1.0, 0.25])
    total, per_fn = score_batch(completions, golds, {"correct": 2.0})
    assert set(per_fn) == {"correct"} and total.tolist() == [2.0, 2.0, 0.0]
    with pytest.raises(ValueError):
        score_batch(completions, golds[:2], {"correct": 1.0})


def test_synthetic_problems_are_gsm8k_format_with_correct_arithmetic(tmp_path):
    problems = generate_problems(300, seed=3)
    assert problems == generate_problems(300, seed=3)
    assert problems != generate_problems(300, seed=4)
    assert len({p["question"] for p in problems}) > 250
    for p in problems:
        assert set(p) == {"question", "answer"} and p["question"].endswith("?")
        for expr, value in re.findall(r"<<([^=]+)=([^>]+)>>", p["answer"]):
            a, op, b = re.fullmatch(r"(-?\d+)([-+*/])(-?\d+)", expr).groups()
            assert OPS[op](int(a), int(b)) == float(value)
        final = gold_answer(p["answer"])
        assert final.lstrip("-").isdigit()
        # the last worked step computes the final answer, so the gold answer is self-consistent
        assert correct_reward(wrap("", final), p["answer"]) == 1.0
    path = write_jsonl(tmp_path / "d" / "train.jsonl", 5, seed=0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == generate_problems(5, seed=0)


@pytest.mark.parametrize("completion, expected", [
    ("1234", 1.0),
    ("ab 12", 0.5),             # spaces do not count
    ("#### 72\n", 2 / 6),
    ("no digits here", 0.0),
    ("", 0.0),
    ("  \n ", 0.0),
])
def test_digits_toy_reward_is_the_share_of_digit_characters(completion, expected):
    assert digits_reward(completion, NATALIA) == pytest.approx(expected)


def test_the_toy_reward_config_selects_only_the_digits_reward():
    from trainer.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "trainer" / "configs" / "tiny_toy_reward.yaml")
    assert cfg.reward_weights == {"digits": 1.0}
    total, per_fn = score_batch(["12 ab", "xyz"], [NATALIA, NATALIA], cfg.reward_weights)
    assert total.tolist() == [0.5, 0.0] and list(per_fn) == ["digits"]
