"""GSM8K prompts: loading (hub or local JSONL), this process's shard, chat-template prompts, and the
fixed-shape, left-padded token arrays the rollout takes.

Every process loads the same dataset and keeps rows `process_index::process_count`, so the processes of a
pod see disjoint prompts with no communication. Epochs are reshuffled with a seed shared by all processes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.config import DataConfig

SYSTEM_PROMPT = (
    "Solve the math problem. First reason step by step inside <think> </think>, then give only the final "
    "number inside <answer> </answer>."
)


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # the GSM8K answer: worked steps and `#### N`


def load_problems(data: DataConfig, split: str) -> list[Problem]:
    """All rows of `split` as Problems: a local .jsonl/.json file, or a hub dataset (openai/gsm8k)."""
    import datasets

    if data.is_local:
        path = str(Path(data.path).expanduser())
        ds = datasets.load_dataset("json", data_files=path, split="train")
    else:
        ds = datasets.load_dataset(data.path, data.name, split=split)
    missing = {"question", "answer"} - set(ds.column_names)
    if missing:
        raise ValueError(f"data.path: {data.path} lacks the GSM8K fields {sorted(missing)} "
                         f"(has {ds.column_names}); each row needs question and answer")
    return [Problem(q, a) for q, a in zip(ds["question"], ds["answer"], strict=True)]


def process_shard(problems: Sequence[Problem], process_index: int, process_count: int) -> list[Problem]:
    """This process's rows (every process_count-th row starting at process_index)."""
    shard = list(problems[process_index::process_count])
    if not shard:
        raise ValueError(f"data: {len(problems)} problems leave none for process {process_index} of "
                         f"{process_count}; use a larger dataset")
    return shard


def prompt_batches(problems: Sequence[Problem], per_step: int, seed: int, shuffle: bool,
                   start_step: int = 0) -> Iterator[list[Problem]]:
    """Endless batches of `per_step` problems, reshuffled each epoch; `start_step` skips ahead on resume."""
    order: list[int] = []
    epoch, step = 0, 0
    while True:
        batch = []
        while len(batch) < per_step:
            if not order:
                idx = np.arange(len(problems))
                if shuffle:
                    np.random.default_rng([seed, epoch]).shuffle(idx)
                order = idx.tolist()
                epoch += 1
            batch.append(problems[order.pop(0)])
        if step >= start_step:
            yield batch
        step += 1




def left_pad(token_lists: Sequence[Sequence[int]], length: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """ids [B, length] int32 and mask [B, length] int32; too-long prompts keep their last `length` tokens."""
    ids = np.full((len(token_lists), length), pad, dtype=np.int32)
    mask = np.zeros((len(token_lists), length), dtype=np.int32)
    for i, tokens in enumerate(token_lists):
        tokens = list(tokens)[-length:]
        if tokens:
            ids[i, length - len(tokens):] = tokens
            mask[i, length - len(tokens):] = 1
    return ids, mask
