"""A short-lived listener on the ports a job's hosts will reach each other on (the JAX coordinator's,
megascale's), so that the console can try them from every worker before the job starts: until the job runs,
nothing listens there, and a refused connection would say nothing about a firewall
(tpu_console/fleet/port_check.py is the console side).

A PythonProgram (fleet/program.py), Python 3.8+ and the standard library only, with arguments
SECONDS EXPECTED PORT...: it binds every PORT on all interfaces and prints, flushed, one line per port

    listening PORT | in-use PORT | error PORT WHY

then `ready`. It accepts connections until EXPECTED have come to every port it holds or SECONDS have
passed, then prints `accepted PORT N` for each port it held and exits. Each connection is read to its end
before it is closed, so the connecting side closes first and this host keeps no TIME_WAIT on the port.
"""

import errno
import selectors
import socket
import sys
import time


def listen(port):
    """A listening socket on `port` of every interface: IPv4 and IPv6 where the host has IPv6, else IPv4."""
    try:
        return _listen(socket.AF_INET6, ("::", port))
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise
    return _listen(socket.AF_INET, ("0.0.0.0", port))  # no IPv6 here (or it is switched off)


def _listen(family, address):
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too
        # Over a TIME_WAIT of a job that ended a moment ago, as the job's server binds; never over a listener.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)  # a 1,024-host pod connects at once
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def main(argv):
    seconds, expected, ports = float(argv[0]), int(argv[1]), [int(p) for p in argv[2:]]
    selector = selectors.DefaultSelector()
    accepted = {}
    for port in ports:
        try:
            selector.register(listen(port), selectors.EVENT_READ, port)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                print(f"in-use {port}", flush=True)
            else:
                print(f"error {port} {exc.strerror or exc}", flush=True)
            continue
        accepted[port] = 0
        print(f"listening {port}", flush=True)
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    talking = 0  # accepted connections not yet read to their end
    while accepted and (talking or min(accepted.values()) < expected):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for key, _ in selector.select(left):
            if key.data is None:  # a connection: its end, or what it sent
                try:
                    ended = not key.fileobj.recv(4096)
                except OSError:
                    ended = True
                if ended:
                    selector.unregister(key.fileobj)
                    key.fileobj.close()
                    talking -= 1
                continue
            try:
                conn, _ = key.fileobj.accept()
            except OSError:
                continue
            conn.setblocking(False)
            selector.register(conn, selectors.EVENT_READ, None)
            accepted[key.data] += 1
            talking += 1
    for port, count in accepted.items():
        print(f"accepted {port} {count}", flush=True)
    for key in list(selector.get_map().values()):
        key.fileobj.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
