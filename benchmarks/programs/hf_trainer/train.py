# Hugging Face Trainer: a tiny GPT-2 made from a config (no download), causal LM on synthetic token sequences.
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.manual_seed(0)


class Sequences(torch.utils.data.Dataset):
    """Token sequences that count upward from a random start, so the next token can be learned."""

    def __init__(self, n, length=32, vocab=128):
        starts = torch.randint(0, vocab, (n, 1))
        self.ids = (starts + torch.arange(length)) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


config = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=4)
model = GPT2LMHeadModel(config)
args = TrainingArguments(
    output_dir="out",
    max_steps=20,
    per_device_train_batch_size=8,
    learning_rate=1e-3,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    use_cpu=True,
)
trainer = Trainer(model=model, args=args, train_dataset=Sequences(64))
trainer.train()
