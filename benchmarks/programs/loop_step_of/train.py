"""Train a small two-layer classifier with numpy, resumable from a checkpoint.

    python train.py --max-steps 40 --save-dir checkpoints                       # from scratch
    python train.py --resume checkpoints/step_40.npz --max-steps 100 --save-dir out
"""
import argparse
import math
import os

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=1024)
parser.add_argument("--lr", type=float, default=0.5)
parser.add_argument("--warmup-steps", type=int, default=10)
parser.add_argument("--schedule-steps", type=int, default=100, help="the cosine decay's length")
parser.add_argument("--eval-every", type=int, default=10)
parser.add_argument("--save-every", type=int, default=20)
parser.add_argument("--save-dir", default="out")
parser.add_argument("--resume", help="a checkpoint to continue from")
args = parser.parse_args()

# data: points in 64 dimensions, labelled by which of 10 random directions they lie closest to
rng = np.random.default_rng(0)
centers = rng.normal(size=(10, 64))
x_all = rng.normal(size=(20480, 64)).astype(np.float32)
y_all = np.argmax(x_all @ centers.T, axis=1)
x_train, y_train, x_val, y_val = x_all[:16384], y_all[:16384], x_all[16384:], y_all[16384:]
print(f"data: {len(x_train)} train / {len(x_val)} val examples, 10 classes")


def init_params():
    r = np.random.default_rng(1)
    return {"w1": (r.normal(size=(64, 256)) / 8).astype(np.float32), "b1": np.zeros(256, np.float32),
            "w2": (r.normal(size=(256, 10)) / 16).astype(np.float32), "b2": np.zeros(10, np.float32)}


def forward(p, x):
    h = np.maximum(x @ p["w1"] + p["b1"], 0)
    logits = h @ p["w2"] + p["b2"]
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    return h, probs


def loss_and_grads(p, x, y):
    h, probs = forward(p, x)
    loss = -np.mean(np.log(probs[np.arange(len(y)), y] + 1e-9))
    d = probs
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    dh = (d @ p["w2"].T) * (h > 0)
    return loss, {"w2": h.T @ d, "b2": d.sum(0), "w1": x.T @ dh, "b1": dh.sum(0)}


def lr_at(step):
    if step <= args.warmup_steps:
        return args.lr * step / args.warmup_steps
    progress = (step - args.warmup_steps) / (args.schedule_steps - args.warmup_steps)
    return 0.5 * args.lr * (1 + math.cos(math.pi * progress))


def evaluate(p):
    _, probs = forward(p, x_val)
    loss = -np.mean(np.log(probs[np.arange(len(y_val)), y_val] + 1e-9))
    return loss, np.mean(probs.argmax(1) == y_val)


params, start = init_params(), 0
if args.resume:
    ckpt = np.load(args.resume)
    params = {k: ckpt[k] for k in ("w1", "b1", "w2", "b2")}
    start = int(ckpt["step"])
    print(f"resuming from step {start} ({args.resume}, val_loss={float(ckpt['val_loss']):.4f})")

os.makedirs(args.save_dir, exist_ok=True)
for step in range(start + 1, args.max_steps + 1):
    # several passes over the batch's shards, as gradient accumulation would
    idx = rng.integers(0, len(x_train), size=args.batch_size * 4)
    loss, grads = 0.0, None
    for shard in np.split(idx, 4):
        shard_loss, g = loss_and_grads(params, x_train[shard], y_train[shard])
        loss += shard_loss / 4
        grads = g if grads is None else {k: grads[k] + g[k] for k in g}
    lr = lr_at(step)
    for k in params:
        params[k] -= lr * grads[k] / 4
    print(f"Step {step}/{args.max_steps}, loss={loss:.4f}, lr={lr:.2e}")
    if step % args.eval_every == 0:
        val_loss, val_acc = evaluate(params)
        print(f"Eval at step {step}: val_loss={val_loss:.4f}, val_acc={val_acc:.3f}")
    if step % args.save_every == 0 or step == args.max_steps:
        path = os.path.join(args.save_dir, f"step_{step}.npz")
        np.savez(path, step=step, val_loss=evaluate(params)[0], **params)
        print(f"saved {path}")
print("training complete")
