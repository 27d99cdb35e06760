"""Looking at runs while they go: following logs and events, health, stacks, metrics of every kind, the
supervisor's policy and decisions, idle nodes."""
