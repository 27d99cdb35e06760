# Makes what Levanter's train_lm reads, here and offline: jsonl text (data/), sentences that count in words so
# the loss falls, and a word-level tokenizer. Levanter's GPT-2 looks up its reference checkpoint "gpt2" (an HF
# config and tokenizer) even for a model trained from scratch; a local folder of that name answers it, holding
# transformers' own GPT2Config and this tokenizer. Run by run.sh before the training.
import json
import os
import random

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, PreTrainedTokenizerFast

WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen".split()
EOS = "<|endoftext|>"


def sentences(count, seed):
    rng = random.Random(seed)
    for _ in range(count):
        start = rng.randrange(len(WORDS))
        yield " ".join(WORDS[(start + i) % len(WORDS)] for i in range(rng.randrange(8, 40)))


def main():
    vocab = {EOS: 0, "<unk>": 1, **{word: i + 2 for i, word in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=EOS, bos_token=EOS, unk_token="<unk>")
    tokenizer.save_pretrained("gpt2")
    GPT2Config(vocab_size=len(vocab)).save_pretrained("gpt2")
    os.makedirs("data", exist_ok=True)
    for split, count, seed in (("train", 2000, 0), ("validation", 50, 1)):
        with open(f"data/{split}.jsonl", "w") as f:
            for text in sentences(count, seed):
                f.write(json.dumps({"text": text}) + "\n")


if __name__ == "__main__":
    main()
