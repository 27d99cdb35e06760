"""The planner: every program of a run compiled for a TPU slice without a TPU, priced from the compiler's
figures and the compiled HLO (docs/plan.md)."""
