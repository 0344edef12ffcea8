#!/usr/bin/env python3
"""Prints a TCP port that is free on 127.0.0.1 now and lies below the
kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), so no
outgoing connection or port-0 bind (NCCL's rank 0 and proxies, a store's
clients) can be handed it before the test's own listener binds it."""
import random
import socket
import sys


def main():
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    top = max(low - 1, 2048)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, top // 2), top)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        print(port)
        return 0
    print("free_port.py: no free port below %d on 127.0.0.1" % low, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
