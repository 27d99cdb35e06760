"""The command channel's frames, as the fleet (fleet/command_channel.py) and the worker's agent (agent.py)
write and read them.

Protocol, after the agent writes MAGIC to say it is ready: frames both ways, each a HEADER (kind,
request id, body length) and a body.
  fleet -> agent   RUN   body = u32 length of the command, the command (utf-8), then its stdin
                   PYTHON  body = u32 length of a Python program (standard library only), the program,
                         then its arguments, NUL-separated: run as __main__ in a fork of the agent, so no
                         interpreter has to start (the run watch's follower, 64 of them at once)
                   KILL  stop the command: SIGTERM to its process group, SIGKILL after agent.py's STOP_GRACE_S
  agent -> fleet   STDOUT / STDERR  a chunk of the command's output, as it comes
                   EXIT  body = i32 exit status (128+N for death by signal N, as in bash); always the
                         last frame of a command, sent once it has exited and closed its stdout/stderr

Python 3.8+ and the standard library only: it runs on the workers, sent with agent.py.
"""

from __future__ import annotations

import struct

PROTOCOL_VERSION = 1
MAGIC = b"\0tpu-console-agent %d\n" % PROTOCOL_VERSION
HEADER = struct.Struct(">cII")  # kind, request id, body length
LENGTH = struct.Struct(">I")
STATUS = struct.Struct(">i")
RUN, PYTHON, KILL = b"r", b"p", b"k"
STDOUT, STDERR, EXIT = b"o", b"e", b"x"


def encode_frame(kind: bytes, request_id: int, body: bytes = b"") -> bytes:
    return HEADER.pack(kind, request_id, len(body)) + body


def encode_run(request_id: int, command: bytes, stdin: bytes = b"") -> bytes:
    return encode_frame(RUN, request_id, LENGTH.pack(len(command)) + command + stdin)


def encode_python(request_id: int, source: bytes, args) -> bytes:
    return encode_frame(PYTHON, request_id, LENGTH.pack(len(source)) + source + b"\0".join(args))


def split_frames(buffer: bytearray) -> list:
    """Take the complete frames (kind, request id, body) off the front of `buffer`, in place; a partial
    frame stays for the next call."""
    frames = []
    offset = 0
    while len(buffer) - offset >= HEADER.size:
        kind, request_id, length = HEADER.unpack_from(buffer, offset)
        end = offset + HEADER.size + length
        if end > len(buffer):
            break
        frames.append((kind, request_id, bytes(buffer[offset + HEADER.size : end])))
        offset = end
    del buffer[:offset]
    return frames
