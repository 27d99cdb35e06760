# Keras 3 on JAX: a small classifier on synthetic data, trained with model.fit and its progress bar.
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

EPOCHS = 3
BATCH_SIZE = 64
SAMPLES = 640  # 10 steps an epoch

rng = np.random.default_rng(0)
x = rng.normal(size=(SAMPLES, 128)).astype("float32")
y = (x[:, :8].sum(axis=1) > 0).astype("int32")

keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input(shape=(128,)),
    keras.layers.Dense(2048, activation="relu"),
    keras.layers.Dense(2048, activation="relu"),
    keras.layers.Dense(2),
])
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
model.fit(x, y, epochs=EPOCHS, batch_size=BATCH_SIZE)
