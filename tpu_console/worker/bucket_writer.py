"""The run's record that outlives its node, as the run's supervisor (supervisor.py) leaves it: written
when the run has ended, and again just before the node is deleted, where the plan's `record` says: a
Cloud Storage bucket (google_apis.py, with the VM's own credentials), or a local pod's folder standing for
one. `runs` on any console reads it back (history/bucket_record.py).

One JSON object, `<prefix><run_id>.json`: the run's record as launched (`launch`: launch.json by its one
schema, run_record.py), the supervisor's decisions, how the run ended and why, its restarts, and each
worker's exit status, last step event and last lines of output. The bucket is the team's: a value of the
run's `.env` that a job printed is masked in those lines, as the console masks it.

Python 3.8+ and the standard library only: shipped into the run folder beside supervisor.py.
"""

import json
import os

try:  # shipped beside this file into the run folder (launch/start.py)
    import google_apis
except ImportError:  # imported as tpu_console.worker.bucket_writer (the console's tests)
    from tpu_console.worker import google_apis

# 2: the run's node, provider and the rest only in `launch` (1 said the node and provider beside it too).
RECORD_FORMAT = 2


def build(launch, decisions, workers, env_file, mask_min_length=1, **end):
    """The record of the run launched as `launch` (a run_record.LaunchRecord): its `decisions` (the
    supervisor's, as written), `workers` ({index: {state, exit_status, cause, stopped, step, step_s,
    last_event, tail}}, each tail masked with the values of `env_file`) and `end` (`written_at`, `outcome`,
    `reason`, `restarts`)."""
    secrets = _env_values(env_file, mask_min_length)
    masked = {str(index): {**worker, "tail": [_mask(line, secrets) for line in worker.get("tail") or []]}
              for index, worker in workers.items()}
    return {"format": RECORD_FORMAT, "run_id": launch.run_id, **end, "launch": launch.to_json(),
            "decisions": decisions, "workers": masked}


def write(target, record):
    """One JSON object, `<prefix><run_id>.json`: in a folder (a local pod's stand-in for the bucket), or
    uploaded to the bucket; where it went."""
    data = json.dumps(record, indent=1).encode()
    name = target.get("prefix", "") + record["run_id"] + ".json"
    if target["kind"] != "folder":
        return google_apis.upload_object(target, name, data)
    path = os.path.join(target["path"], name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as out:
        out.write(data)
    os.replace(path + ".tmp", path)
    return path


def place(target):
    """Where records of this target go, for a message."""
    if target.get("kind") == "folder":
        return target.get("path")
    return f"gs://{target.get('bucket')}/{target.get('prefix', '')}"


def _env_values(path, min_length):
    """The values of a `.env` file's KEY=value lines (quotes and `export` taken off), longest first."""
    values = set()
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:
        line = line.strip()
        key, sep, value = (line[len("export "):] if line.startswith("export ") else line).partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if sep and key.strip() and not key.lstrip().startswith("#") and len(value) >= max(1, min_length):
            values.add(value)
    return sorted(values, key=len, reverse=True)


def _mask(line, secrets):
    for value in secrets:
        line = line.replace(value, "***")
    return line
