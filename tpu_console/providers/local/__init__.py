"""The local provider: simulated TPU pods on this machine (folders as disks, asyncssh servers as hosts)."""

from tpu_console.providers.local.provider import LocalProvider
from tpu_console.providers.local.shapes import parse_local_type

__all__ = ["LocalProvider", "parse_local_type"]
