"""The pod doctor: every chip, link and port of a node checked at once, a fault named in one line with its fix
([docs/doctor.md](../../docs/doctor.md)). `check_node` (check.py) runs it; findings.py judges the figures;
expected.py prices the collectives with the planner's interconnect figures."""

from tpu_console.doctor.check import DoctorReport, check_node

__all__ = ["DoctorReport", "check_node"]
