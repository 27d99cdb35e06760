# A loop with nothing but a tqdm bar over its steps: each step sorts and sums a few arrays.
import random

from tqdm import tqdm

STEPS = 200

random.seed(0)
data = [random.random() for _ in range(20000)]
total = 0.0
for _ in tqdm(range(STEPS)):
    random.shuffle(data)
    total += sum(sorted(data)[:100])
print(f"checksum {total:.3f}")
