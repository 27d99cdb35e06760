"""The controller: the recovery loop that brings managed runs back after a preemption, with nobody watching
(docs/managed-runs.md).

store.py: objects with compare-and-swap, in the bucket or the folder standing for it; lease.py: which
controller acts; state.py: a managed run's record (its incarnations, budgets and the journal of the action
it is about to take); observe.py: what the cloud and the workers say now, read carefully; loop.py: the
reconcile loop, one idempotent step per run per pass; daemon.py: where the loop runs (this machine, an SSH
host, a small Compute Engine VM) and `controller start | status | logs | stop`.
"""
