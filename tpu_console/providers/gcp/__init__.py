"""Cloud TPU VMs through the TPU v2 API (see docs/gcp.md)."""

from tpu_console.providers.gcp.provider import GcpProvider

__all__ = ["GcpProvider"]
