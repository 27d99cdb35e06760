"""Starting and stopping jobs on a node's workers: one preflight for every job kind, the launch lock,
ports, inputs."""
