"""Two CPU savings in asyncssh's packet path, for the console's connections and the local pods' servers.
Neither changes what a peer can observe beyond the absence of padding packets.

- Packet logging. asyncssh formats a log line (names, sizes, a note) for every packet it sends and
  receives, then drops it unless its debug level is 3 or more. Below that, the formatting is skipped.
- An empty SSH_MSG_IGNORE before every packet. asyncssh sends one ahead of each packet once a cipher is
  on: the defence against predictable CBC IVs (RFC 4251, 9.3.1). AES-GCM, chacha20-poly1305 and CTR do
  not need it, and it doubles the packets (and their encryption, sending and decoding at both ends) of
  every exchange: a command on the command channel is one packet each way instead of two. The padding
  packet is kept whenever the connection sends with a CBC cipher.

Measured on the 64-worker fan-out (benchmarks/fanout.py): about 2 ms less CPU per fan-out in the client
and 2 ms in the pod's servers. Applied once per process by `apply()`, and only when asyncssh's internals
are the ones this was written against (asyncssh 2.x: the names checked below); otherwise nothing changes.
"""

from __future__ import annotations

import asyncssh.connection
import asyncssh.logging
import asyncssh.packet

_MSG_IGNORE = 2  # SSH_MSG_IGNORE (RFC 4253)
_PACKET_LOG_LEVEL = 3  # asyncssh's debug level for packet logs
_applied = False


def apply() -> bool:
    """Patch asyncssh once; True when the savings are in place."""
    global _applied
    if _applied:
        return True
    logger_cls = asyncssh.packet.SSHPacketLogger
    connection_cls = asyncssh.connection.SSHConnection
    if not (
        callable(getattr(logger_cls, "_log_packet", None))
        and callable(getattr(connection_cls, "send_packet", None))
        and hasattr(asyncssh.logging.SSHLogger, "_debug_level")
        and getattr(asyncssh.connection, "MSG_IGNORE", None) == _MSG_IGNORE
    ):
        return False
    log_packet = logger_cls._log_packet
    send_packet = connection_cls.send_packet

    def _log_packet_if_logged(self, *args, **kwargs):
        if asyncssh.logging.SSHLogger._debug_level >= _PACKET_LOG_LEVEL:
            log_packet(self, *args, **kwargs)

    def _send_packet_without_padding(self, pkttype, *args, **kwargs):
        if pkttype == _MSG_IGNORE and "-cbc" not in (self.get_extra_info("send_cipher") or "-cbc"):
            return
        send_packet(self, pkttype, *args, **kwargs)

    logger_cls._log_packet = _log_packet_if_logged
    connection_cls.send_packet = _send_packet_without_padding
    _applied = True
    return True
