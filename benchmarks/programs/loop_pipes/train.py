# A first JAX training loop: fit a small MLP to a noisy sine, print one line a step.
import time

import jax
import jax.numpy as jnp

STEPS = 30
LR = 0.002

key = jax.random.PRNGKey(0)
kx, kn, k1, k2, k3 = jax.random.split(key, 5)
x = jax.random.uniform(kx, (4096, 1), minval=-3, maxval=3)
y = jnp.sin(x) + 0.1 * jax.random.normal(kn, x.shape)

params = {
    "w1": jax.random.normal(k1, (1, 512)) * 0.5, "b1": jnp.zeros(512),
    "w2": jax.random.normal(k2, (512, 512)) / jnp.sqrt(512), "b2": jnp.zeros(512),
    "w3": jax.random.normal(k3, (512, 1)) / jnp.sqrt(512), "b3": jnp.zeros(1),
}


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    h = jnp.tanh(h @ params["w2"] + params["b2"])
    pred = h @ params["w3"] + params["b3"]
    return jnp.mean((pred - y) ** 2)


@jax.jit
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    params = jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads)
    return params, loss


for step in range(1, STEPS + 1):
    t0 = time.time()
    params, loss = train_step(params, x, y)
    loss = float(loss)
    print(f"step {step} | loss {loss:.4f} | {time.time() - t0:.2f} s/step")

print("done")
