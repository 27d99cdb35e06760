"""A launched job on a node's workers: run ids, launch, status probes, monitoring, logs, stop, history."""
