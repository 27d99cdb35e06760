"""How the run's supervisor (supervisor.py) deletes its node, as the plan's `delete` target says, and
whether it should: a run started on the node after this one (its folder beside this one's, with a later
id) keeps the node.

A Cloud TPU node goes through the TPU API with the VM's own credentials (google_apis.py). A local pod runs
the command the plan names: the console's own removal (providers/local/remove_pod.py, which
`LocalProvider.delete` uses too), so the pod's layout and how its jobs are stopped live there only. An ssh
node cannot be deleted from the pod (launch refuses the options that would).

Python 3.8+ and the standard library only: shipped into the run folder beside supervisor.py.
"""

import os
import subprocess

try:  # shipped beside this file into the run folder (launch/start.py)
    import google_apis
except ImportError:  # imported as tpu_console.worker.node_deletion (the console's tests)
    from tpu_console.worker import google_apis


def newer_run(folder):
    """A run started on this node after the one in `folder` (its folder beside it): its id, or None."""
    runs = os.path.dirname(os.path.abspath(folder))
    mine = os.path.basename(os.path.abspath(folder))
    try:
        return next((n for n in sorted(os.listdir(runs)) if n > mine and os.path.isdir(
            os.path.join(runs, n))), None)
    except OSError:
        return None


def delete_node(target, provider):
    """Delete the node as `target` (the plan's `delete`) says; RuntimeError where it cannot be done from
    the pod (`provider`: the node's, for the message)."""
    kind = (target or {}).get("kind")
    if kind == "local":
        delete_local_pod(target)
    elif kind == "gcp":
        google_apis.delete_tpu_node(target)
    else:
        raise RuntimeError(f"this node's provider ({provider}) cannot be deleted from the pod")


def delete_local_pod(target):
    """Run the console's own removal of a local pod; this machine is the pod's, so the console's
    interpreter is here."""
    result = subprocess.run(target["command"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            timeout=120, cwd=os.path.dirname(os.path.abspath(target["node_dir"])))
    if result.returncode != 0:
        lines = result.stdout.decode("utf-8", "replace").strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"the removal exited {result.returncode}")
