"""The rollout: sampling completions from the model with a preallocated KV cache, on one device or laid out
over a slice.

- `sampler.py`: the Sampler (prompts into buckets, prefill, the decode loop and its named state);
- `sampling.py`: one token a row drawn from logits (temperature, top-k, top-p);
- `split_sampling.py`: the same draw from a vocabulary split over devices;
- `layouts.py`: the three rollout layouts (fsdp, megatron, head_groups) and how one is chosen;
- `decode_layouts.py`: megatron's and head_groups' decode steps, every collective written out;
- `weight_placement.py`: where each weight lives, in training and in each layout;
- `sharded.py`: the Sampler across processes and devices, laid out as its layout says;
- `stacked.py`: the same for a model whose blocks are one scanned layer (stacked weights and cache).
"""
