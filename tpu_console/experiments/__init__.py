"""Experiments built from the layers below: the FSDP memory bench, the largest-batch finder, preemption
recovery. Each is a page of manual work on a TPU pod, done as one command."""
