"""GSM8K rewards on completion text: correctness, strict format, tag counts, and their weighted sum.

Completions are expected as `<think>...</think><answer>...</answer>` (the prompt asks for it). Every reward
function takes the completion text and the gold GSM8K answer and returns a float; `score_batch` applies the
configured weights to a batch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np

_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_STRICT_FORMAT_RE = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def gold_answer(answer: str) -> str:
    """The number after `####` in a GSM8K answer (`"... #### 1,234"` -> `"1,234"`)."""
    return answer.split("####")[-1].strip()


def parse_number(text: str) -> float | None:
    """The last number in `text`, ignoring `$`, thousands commas, units and trailing periods; None if none."""
    matches = _NUMBER_RE.findall(text.replace("$", ""))
    if not matches:
        return None
    try:
        return float(matches[-1].replace(",", ""))
    except ValueError:
        return None


def final_answer(completion: str) -> str:
    """What the model answered: the last `<answer>` block, or the whole completion when it has none."""
    blocks = _ANSWER_RE.findall(completion)
    return blocks[-1] if blocks else completion


def correct_reward(completion: str, gold: str) -> float:
    """1.0 when the model's final number equals the gold number (after `####`), else 0.0."""
    expected = parse_number(gold_answer(gold))
    got = parse_number(final_answer(completion))
    if expected is None or got is None:
        return 0.0
    return 1.0 if abs(expected - got) <= 1e-6 * max(1.0, abs(expected)) else 0.0


def format_reward(completion: str, gold: str) -> float:
    """1.0 when the whole completion is exactly `<think>...</think> <answer>...</answer>`."""
    return 1.0 if _STRICT_FORMAT_RE.match(completion.strip()) else 0.0


def tag_count_reward(completion: str, gold: str) -> float:
    """0.25 for each of the four tags that appears exactly once: partial credit on the way to the format."""
    return sum(0.25 for tag in _TAGS if completion.count(tag) == 1)


def digits_reward(completion: str, gold: str) -> float:
    """The share of the completion's non-space characters that are digits. A toy reward, not GSM8K's: dense
    enough that the tiny random model visibly learns it in a few minutes on a local pod (the demo)."""
    characters = [c for c in completion if not c.isspace()]
    return sum(c.isdigit() for c in characters) / len(characters) if characters else 0.0


REWARD_FUNCTIONS: dict[str, Callable[[str, str], float]] = {
    "correct": correct_reward,
    "format": format_reward,
    "tag_count": tag_count_reward,
    "digits": digits_reward,
}


def score_batch(completions: Sequence[str], golds: Sequence[str],
                weights: Mapping[str, float]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(weighted total [B], {name: unweighted per-function scores [B]}) for the functions with a weight."""
    if len(completions) != len(golds):
        raise ValueError(f"{len(completions)} completions but {len(golds)} gold answers")
    per_fn = {name: np.array([REWARD_FUNCTIONS[name](c, g) for c, g in zip(completions, golds, strict=True)],
                             dtype=np.float32)
              for name in weights}
    total = np.zeros(len(completions), dtype=np.float32)
    for name, w in weights.items():
        total += np.float32(w) * per_fn[name]
    return total, per_fn
