"""The pod doctor's check, run on every worker at once (`tpu-console doctor NODE`, tpu_console/doctor/ is the
console side): a JAX program over jax.distributed that tests each chip, then the links between them.

It joins the other workers as a job does (JAX_COORDINATOR_ADDRESS and TPU_CONSOLE_NUM_PROCESSES /
TPU_CONSOLE_PROCESS_ID where the console names the coordinator, JAX's own discovery on a Cloud TPU VM), and
prints one line per figure, `doctor {json}`, flushed, in this order:

    devices   the chips this host exposes (local), and every host's count as JAX sees them (counts)
    chip      per local chip: a matmul of small integers whose checksum is known exactly, and an HBM
              write/read of a pattern read back whole; each timed
    enter     before each collective (the console names a worker that never printed it: it never reached
              the collective the others wait in)
    ring      an all-reduce along one axis of the mesh (the slices, then each axis inside a slice), timed
              on this host; the console prices it against the chips' interconnect
    group     an all-reduce inside groups of G hosts of a slice, G halving down to 2 (a pair), each size
              with at least two groups in the pod: the console reads these timings as a bisection, down to
              the pair of hosts (one host alone is ring:chip; one group of a slice's every host is
              ring:host, with nothing to compare it with)
    dcn       between slices: each slice sends to the slice `shift` away, every shift, timed here
    done

Hosts with fewer chips than their peers stop after `devices` (no even mesh exists). Timings are per host:
a host leaves a collective when its own chips have their result, so a slow group's hosts report the time.
A collective's figure is the median of --reps runs after a first one; the first run's seconds (`first_s`,
where its connections are set up) and its compile's (`compile_s`) are there too.

Arguments: --bytes N (the all-reduce payload per chip), --hbm-bytes N (the pattern per chip), --reps N,
--slices N (hosts numbered slice by slice), --hosts-per-slice N.

Test hook: TPU_CONSOLE_DOCTOR_FAULT, comma-separated, makes this program misbehave on purpose, since a CPU
does not fail as a chip does: `wrong-result:W:D` (worker W's chip D returns a matmul off by one),
`never-enters:W` (worker W never enters the first collective; it sleeps instead). W is TPU_CONSOLE_WORKER.

Python 3.8+; JAX and NumPy from the worker's environment (named when absent).
"""

import argparse
import json
import os
import statistics
import sys
import time

try:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax._src import distributed  # its coordination service's barrier (leave): not public API
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
except ImportError as exc:  # the worker's environment lacks JAX: named, nothing else runs
    print("doctor " + json.dumps({"phase": "error", "error": f"cannot import JAX here: {exc}"}), flush=True)
    sys.exit(3)

FAULT_ENV = "TPU_CONSOLE_DOCTOR_FAULT"
# a 256x256 product of integers below 8: exact whatever the matmul precision (the inputs fit bf16 and TF32,
# every sum of products stays below 2**24 in float32 accumulation), so it is compared entry by entry
MATMUL_N = 256
HBM_BYTES = 16 * 1024 * 1024  # per chip, unless told: the pattern written and read back


def say(phase, **fields):
    fields["phase"] = phase
    fields["t"] = time.time()
    print("doctor " + json.dumps(fields), flush=True)


def faults(worker):
    """This worker's injected faults: {"wrong-result": {chip, ...}, "never-enters": bool}."""
    wrong, never = set(), False
    for part in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        words = part.strip().split(":")
        if words[0] == "wrong-result" and len(words) == 3 and int(words[1]) == worker:
            wrong.add(int(words[2]))
        elif words[0] == "never-enters" and len(words) == 2 and int(words[1]) == worker:
            never = True
    return {"wrong-result": wrong, "never-enters": never}


def join():
    """jax.distributed as a job joins it: the coordinator the console names, else JAX's own discovery."""
    address = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if address:
        jax.distributed.initialize(coordinator_address=address,
                                   num_processes=int(os.environ["TPU_CONSOLE_NUM_PROCESSES"]),
                                   process_id=int(os.environ["TPU_CONSOLE_PROCESS_ID"]))
    # a Cloud TPU VM, told as the trainer tells one (trainer/distributed.py): peers from the VM's metadata
    elif (os.environ.get("TPU_WORKER_HOSTNAMES") or os.environ.get("TPU_ACCELERATOR_TYPE")
          or os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0")):
        jax.distributed.initialize()


def timed(fn, arg, reps, first=None):
    """The median seconds of `reps` runs of a compiled `fn` (one run first, whose seconds go in `first`
    when given: a collective's first run sets up its connections), and its last result."""
    start = time.perf_counter()
    out = fn(arg)
    jax.block_until_ready(out)
    if first is not None:
        first["first_s"] = time.perf_counter() - start
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        out = fn(arg)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def check_chips(worker, wrong, reps, hbm_bytes):
    """Each local chip: the known matmul and the HBM pattern."""
    n = MATMUL_N
    a_host = (np.arange(n * n, dtype=np.int64).reshape(n, n) % 7).astype(np.float32)
    b_host = (np.arange(n * n, dtype=np.int64).reshape(n, n) % 5).astype(np.float32)
    want = a_host.astype(np.int64) @ b_host.astype(np.int64)  # every entry below 2**24: exact in float32
    words = hbm_bytes // 4
    matmul = jax.jit(lambda a, b: a @ b)
    # the pattern: each word its index, xor'd so neighbours differ in many bits; written, then read back
    write = jax.jit(lambda seed: jnp.bitwise_xor(jnp.arange(words, dtype=jnp.uint32), seed))
    for index, device in enumerate(jax.local_devices()):
        a, b = jax.device_put(a_host, device), jax.device_put(b_host, device)
        matmul_s, product = timed(lambda pair: matmul(*pair), (a, b), reps)
        got = np.asarray(product).astype(np.int64)
        if index in wrong:
            got[n // 2, n // 3] += 1  # the test hook: this chip answers wrong
        wrong_entries = int(np.count_nonzero(got != want))
        seed = jax.device_put(np.uint32(0x5A5A5A5A), device)
        hbm_s, pattern = timed(write, seed, reps)
        back = np.asarray(pattern)
        expected = np.bitwise_xor(np.arange(words, dtype=np.uint32), np.uint32(0x5A5A5A5A))
        bad_words = int(np.count_nonzero(back != expected))
        say("chip", chip=index, device=str(device), matmul_ok=wrong_entries == 0,
            matmul_checksum=int(got.sum()), matmul_want=int(want.sum()), matmul_wrong_entries=wrong_entries,
            matmul_s=matmul_s, hbm_ok=bad_words == 0, hbm_bad_words=bad_words, hbm_bytes=words * 4,
            hbm_s=hbm_s)


def slice_meshes(hosts_per_slice, slices):
    """Every device in a (slice, host, chip) array: hosts numbered slice by slice, chips by id."""
    by_process = {}
    for device in jax.devices():
        by_process.setdefault(device.process_index, []).append(device)
    grid = [sorted(by_process[p], key=lambda d: d.id) for p in sorted(by_process)]
    return np.array(grid, dtype=object).reshape(slices, hosts_per_slice, -1)


def all_reduce(devices, axes, reduce_over, payload_bytes):
    """A compiled psum over `reduce_over` on a mesh of `devices` named `axes`, and its argument."""
    mesh = Mesh(devices, axes)
    spec = P(axes)
    per_chip = max(1, payload_bytes // 4)
    shape = (devices.size, per_chip)
    sharding = NamedSharding(mesh, spec)
    arg = jax.make_array_from_callback(shape, sharding, lambda idx: np.ones((1, per_chip), np.float32))
    fn = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, reduce_over), mesh=mesh, in_specs=spec,
                               out_specs=spec))
    return fn, arg


def shift_between_slices(devices, shift, payload_bytes):
    """A compiled send from each slice to the slice `shift` away (each chip to the same chip there)."""
    slices = devices.shape[0]
    axes = ("slice", "host", "chip")
    mesh = Mesh(devices, axes)
    spec = P(axes)
    per_chip = max(1, payload_bytes // 4)
    sharding = NamedSharding(mesh, spec)
    arg = jax.make_array_from_callback((devices.size, per_chip), sharding,
                                       lambda idx: np.ones((1, per_chip), np.float32))
    pairs = [(i, (i + shift) % slices) for i in range(slices)]
    fn = jax.jit(jax.shard_map(lambda x: jax.lax.ppermute(x, "slice", pairs), mesh=mesh, in_specs=spec,
                               out_specs=spec))
    return fn, arg


def group_sizes(hosts, slices):
    """The groups of the bisection: a slice's hosts (when there are several slices to compare), then
    halving (by the smallest factor) down to 2; 1 is left out (one host alone: ring:chip)."""
    sizes, size = [hosts] if slices > 1 and hosts > 1 else [], hosts
    while size > 1:
        factor = next(f for f in range(2, size + 1) if size % f == 0)
        size //= factor
        if size > 1:
            sizes.append(size)
    return sizes


def collective(name, fn, arg, reps, never_enters, **fields):
    if never_enters:  # the test hook: this worker stays away, as one stuck before a collective would
        while True:
            time.sleep(60)
    say("enter", name=name)
    seconds, _ = timed(fn, arg, reps, first=fields)
    say(fields.pop("kind"), name=name, seconds=seconds, **fields)


def parse(argv):
    parser = argparse.ArgumentParser(prog="doctor_check.py")
    parser.add_argument("--bytes", type=int, default=1 << 20)
    parser.add_argument("--hbm-bytes", type=int, default=HBM_BYTES)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--slices", type=int, default=1)
    parser.add_argument("--hosts-per-slice", type=int, default=0)
    return parser.parse_args(argv)


def main(argv):
    options = parse(argv)
    payload, reps, slices = options.bytes, options.reps, options.slices
    worker = int(os.environ.get("TPU_CONSOLE_WORKER", "0"))
    injected = faults(worker)
    start = time.time()
    join()
    counts = {}
    for device in jax.devices():
        counts[device.process_index] = counts.get(device.process_index, 0) + 1
    say("devices", local=jax.local_device_count(), process=jax.process_index(), processes=jax.process_count(),
        counts={str(p): c for p, c in sorted(counts.items())}, platform=jax.devices()[0].platform,
        kind=jax.devices()[0].device_kind, joined_s=time.time() - start)
    check_chips(worker, injected["wrong-result"], reps, options.hbm_bytes)
    if len(set(counts.values())) > 1:
        say("done", skipped="hosts expose different chip counts: no even mesh")
        leave()
    hosts_per_slice = options.hosts_per_slice or jax.process_count() // slices
    devices = slice_meshes(hosts_per_slice, slices)
    chips = devices.shape[2]
    planned = []  # (name, fn, arg, fields): compiled before the first is entered, so `enter` means running
    if slices > 1:
        fn, arg = all_reduce(devices, ("slice", "host", "chip"), "slice", payload)
        planned.append(("ring:slice", fn, arg, {"kind": "ring", "axis": "slice", "group": slices}))
    for axis, length in (("host", hosts_per_slice), ("chip", chips)):
        if length > 1:
            fn, arg = all_reduce(devices, ("slice", "host", "chip"), axis, payload)
            planned.append((f"ring:{axis}", fn, arg, {"kind": "ring", "axis": axis, "group": length}))
    for size in group_sizes(hosts_per_slice, slices):
        grouped = devices.reshape(slices, hosts_per_slice // size, size, chips)
        fn, arg = all_reduce(grouped, ("slice", "rest", "group", "chip"), ("group", "chip"), payload)
        planned.append((f"group:{size}", fn, arg, {"kind": "group", "size": size,
                                                  "group_index": jax.process_index() % hosts_per_slice
                                                  // size}))
    for shift in range(1, slices):
        fn, arg = shift_between_slices(devices, shift, payload)
        planned.append((f"dcn:{shift}", fn, arg, {"kind": "dcn", "shift": shift}))
    compiled = []
    for name, fn, arg, fields in planned:
        start = time.perf_counter()
        compiled.append((name, fn.lower(arg).compile(), arg, fields))
        fields["compile_s"] = time.perf_counter() - start
    for name, fn, arg, fields in compiled:
        collective(name, fn, arg, reps, injected["never-enters"], payload_bytes=payload, **fields)
    say("done", seconds=time.time() - start)
    leave()


def leave():
    """Exit once every host is here, without jax.distributed's shutdown (it takes seconds more); the
    coordinator's host last, so no peer loses it while finishing. The hosts meet at the coordination
    service's barrier, not in a collective: nothing to compile, and hosts with different chip counts meet
    there too. It waits as long as the console lets the check run (the console's deadline ends it)."""
    if jax.process_count() > 1:
        distributed.global_state.client.wait_at_barrier("doctor done", 24 * 3600 * 1000)
    sys.stdout.flush()
    if jax.process_index() == 0:
        time.sleep(1.0)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
