#!/usr/bin/env python3
"""A small stand-in for torchrun's agent store: the server side of PyTorch's
TCPStore wire protocol, stdlib only, for tests/c/test_rendezvous.c.

It follows PyTorch's own source: main after 2.10, read from a mirror at
commit a9a89d9c (the 2.11 tag itself was not available); the earlier libuv
server at c10d/TCPStoreLibUvBackend.cpp (commit 01afc5c9) handles the same
queries the same way, and QueryType is only ever appended to:
  torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp:13-40 (before the move:
    c10d/TCPStoreBackend.hpp): validationMagicNumber = 0x3C85F7CE; QueryType
    (uint8) VALIDATE=0 SET=1 COMPARE_SET=2 GET=3 ADD=4 CHECK=5 WAIT=6
    GETNUMKEYS=7 DELETE_KEY=8 APPEND=9 MULTI_GET=10 MULTI_SET=11 CANCEL_WAIT=12
    PING=13 QUEUE_PUSH=14 QUEUE_POP=15 QUEUE_LEN=16 LIST_KEYS=17 BARRIER=18;
    CheckResponseType READY=0 NOT_READY=1; WaitResponseType STOP_WAITING=0
    WAIT_CANCELED=1.
  store/TCPStoreLibUvBackend.cpp, UvClient::processBuf and parse_*_command:
    a new client is "miscellaneous" until its first query, which must be
    VALIDATE + uint32 magic (no reply); PING + uint32 nonce -> the nonce; SET
    key value -> no reply; GET key -> uint64 length + bytes (zero bytes for a
    missing key); ADD key int64 -> int64; CHECK uint64 n, n keys -> one byte;
    WAIT uint64 n, n keys -> one byte STOP_WAITING once all are set;
    CANCEL_WAIT -> one byte WAIT_CANCELED; DELETE_KEY key -> int64;
    GETNUMKEYS -> int64; unknown query -> connection closed. Keys are read
    by ChunkedStream::read_key (uint64 length, at most MAX_STRING_LEN = 8 KiB),
    values by read_payload (uint64 length, at most MAX_PAYLOAD_LEN = 8 MiB);
    all integers in the host's byte order.
  store/TCPStoreLibUvBackend.cpp, LibUVStoreDaemon::unregisterClient: a
    closed connection's pending WAIT is dropped.
Differences, on purpose: a client whose first query is not a valid VALIDATE
is disconnected (libuv ignores it), so a test sees a client that forgets the
handshake; QUEUE_*, LIST_KEYS, BARRIER, APPEND, COMPARE_SET and MULTI_* are
not served (commplan sends none of them).

  fake_tcpstore.py --port-file F [--mode MODE] [--log L] [--max-seconds S]
Listens on a free loopback port, writes it to F (whole, by rename), and
stops by itself after S seconds (default 60). --mode close accepts and
closes at once; --mode silent reads and never answers. --log records each
query as one line: "VALIDATE ok", "PING", "ADD <key> <n>", "SET <key> <n>",
"WAIT <key>", "GET <key> <n>".

Hostile modes, for the client's error paths (each after a valid handshake
unless said otherwise):
  garbage         answers the first query with bytes no store sends
                  (0xdeadbeef..., never a PING's nonce), then only reads
  truncated-ping  half of the PING echo, then closes
  bad-wait        WAIT answered 127 (neither STOP_WAITING nor WAIT_CANCELED)
  bad-set-ping    the PING after a SET echoed with the wrong nonce
  (in these modes a WAIT is answered at once and ADD, SET and GET are served)
  truncated-get   GET: length 128, then 10 bytes, then closes
  stall-get       GET: length 128, then 10 bytes, then silence
  huge-get        GET: length 2**64 - 1, then silence
  random          each query answered with a random mix (seeded by --seed
                  and the connection's number) of the right echo, a WAIT
                  answer, a length prefix (0, 128, 2**63, 2**64 - 1, ...),
                  random bytes, cut short; or a close, or silence
"""
import argparse
import os
import random
import select
import socket
import struct
import sys
import threading
import time

MAGIC = 0x3C85F7CE
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY = range(9)
CANCEL_WAIT, PING = 12, 13
READY, NOT_READY = 0, 1
STOP_WAITING, WAIT_CANCELED = 0, 1
MAX_STRING_LEN = 8 * 1024
MAX_PAYLOAD_LEN = 8 * 1024 * 1024


class Closed(Exception):
    pass


class Store:
    def __init__(self, log_path):
        self.data = {}
        self.cond = threading.Condition()
        self.log_lock = threading.Lock()
        self.log_path = log_path

    def log(self, line):
        if not self.log_path:
            return
        with self.log_lock, open(self.log_path, "a") as f:
            f.write(line + "\n")


def recv_exact(conn, n):
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise Closed()
        out += chunk
    return out


def recv_u64(conn):
    return struct.unpack("=Q", recv_exact(conn, 8))[0]


def recv_key(conn):
    n = recv_u64(conn)
    if n > MAX_STRING_LEN:
        raise Closed()  # libuv: TORCH_CHECK fails, the client is closed
    return recv_exact(conn, n).decode("latin-1")


def recv_payload(conn):
    n = recv_u64(conn)
    if n > MAX_PAYLOAD_LEN:
        raise Closed()
    return recv_exact(conn, n)


def wait_for(conn, store, keys):
    """WAIT: answer STOP_WAITING once every key is set; meanwhile a
    CANCEL_WAIT from the client is answered WAIT_CANCELED, and a closed
    connection drops the wait (as unregisterClient does)."""
    while True:
        with store.cond:
            if all(k in store.data for k in keys):
                conn.sendall(bytes([STOP_WAITING]))
                return
            store.cond.wait(0.05)
        readable, _, _ = select.select([conn], [], [], 0)
        if readable:
            cmd = conn.recv(1)
            if not cmd:
                raise Closed()
            if cmd[0] != CANCEL_WAIT:
                raise Closed()  # a pipelined query during WAIT: not something PyTorch's client sends
            store.log("CANCEL_WAIT")
            conn.sendall(bytes([WAIT_CANCELED]))
            return


def serve_client(conn, store):
    first = recv_exact(conn, 1)[0]
    if first != VALIDATE or struct.unpack("=I", recv_exact(conn, 4))[0] != MAGIC:
        store.log("not validated: first query %d" % first)
        return
    store.log("VALIDATE ok")
    while True:
        cmd = recv_exact(conn, 1)[0]
        if cmd == PING:
            nonce = recv_exact(conn, 4)
            store.log("PING")
            conn.sendall(nonce)
        elif cmd == SET:
            key, value = recv_key(conn), recv_payload(conn)
            store.log("SET %s %d" % (key, len(value)))
            with store.cond:
                store.data[key] = value
                store.cond.notify_all()
        elif cmd == GET:
            key = recv_key(conn)
            with store.cond:
                value = store.data.get(key, b"")
            store.log("GET %s %d" % (key, len(value)))
            conn.sendall(struct.pack("=Q", len(value)) + value)
        elif cmd == ADD:
            key = recv_key(conn)
            delta = struct.unpack("=q", recv_exact(conn, 8))[0]
            with store.cond:
                total = int(store.data.get(key, b"0")) + delta
                store.data[key] = str(total).encode()
                store.cond.notify_all()
            store.log("ADD %s %d" % (key, delta))
            conn.sendall(struct.pack("=q", total))
        elif cmd in (CHECK, WAIT):
            keys = [recv_key(conn) for _ in range(recv_u64(conn))]
            store.log("%s %s" % ("CHECK" if cmd == CHECK else "WAIT", " ".join(keys)))
            if cmd == CHECK:
                with store.cond:
                    ready = all(k in store.data for k in keys)
                conn.sendall(bytes([READY if ready else NOT_READY]))
            else:
                wait_for(conn, store, keys)
        elif cmd == CANCEL_WAIT:
            store.log("CANCEL_WAIT")
            conn.sendall(bytes([WAIT_CANCELED]))
        elif cmd == DELETE_KEY:
            key = recv_key(conn)
            with store.cond:
                deleted = 1 if store.data.pop(key, None) is not None else 0
            conn.sendall(struct.pack("=q", deleted))
        elif cmd == GETNUMKEYS:
            with store.cond:
                conn.sendall(struct.pack("=q", len(store.data)))
        else:
            store.log("unknown query %d: closing" % cmd)
            return


HOSTILE = ("garbage", "truncated-ping", "bad-wait", "bad-set-ping", "truncated-get", "stall-get", "huge-get")


def drain(conn):
    """Silence: read until the client closes."""
    while conn.recv(4096):
        pass


def hostile_client(conn, store, mode):
    """Serves as the store does, except the one reply the mode spoils; a
    WAIT is answered at once (no peer is coming), a GET of a missing key with
    zero bytes."""
    if mode == "garbage":
        recv_exact(conn, 1)
        conn.sendall(b"\xde\xad\xbe\xef" * 16)
        drain(conn)
        return
    if recv_exact(conn, 1)[0] != VALIDATE or struct.unpack("=I", recv_exact(conn, 4))[0] != MAGIC:
        store.log("not validated")
        return
    store.log("VALIDATE ok")
    if recv_exact(conn, 1)[0] != PING:
        return
    nonce = recv_exact(conn, 4)
    if mode == "truncated-ping":
        conn.sendall(nonce[:2])
        return
    conn.sendall(nonce)
    after_set = False
    while True:
        cmd = recv_exact(conn, 1)[0]
        if cmd == ADD:
            key = recv_key(conn)
            delta = struct.unpack("=q", recv_exact(conn, 8))[0]
            with store.cond:
                total = int(store.data.get(key, b"0")) + delta
                store.data[key] = str(total).encode()
            store.log("ADD %s %d" % (key, delta))
            conn.sendall(struct.pack("=q", total))
        elif cmd == SET:
            key, value = recv_key(conn), recv_payload(conn)
            store.log("SET %s %d" % (key, len(value)))
            with store.cond:
                store.data[key] = value
            after_set = True
        elif cmd == PING:
            nonce = recv_exact(conn, 4)
            if mode == "bad-set-ping" and after_set:
                conn.sendall(bytes(b ^ 0xff for b in nonce))
                drain(conn)
                return
            conn.sendall(nonce)
        elif cmd == WAIT:
            keys = [recv_key(conn) for _ in range(recv_u64(conn))]
            store.log("WAIT %s" % " ".join(keys))
            if mode == "bad-wait":
                conn.sendall(bytes([127]))
                drain(conn)
                return
            conn.sendall(bytes([STOP_WAITING]))
        elif cmd == GET:
            key = recv_key(conn)
            store.log("GET %s" % key)
            if mode == "huge-get":
                conn.sendall(struct.pack("=Q", 2**64 - 1))
                drain(conn)
                return
            if mode in ("truncated-get", "stall-get"):
                conn.sendall(struct.pack("=Q", 128) + b"\x01" * 10)
                if mode == "stall-get":
                    drain(conn)
                return
            with store.cond:
                value = store.data.get(key, b"")
            conn.sendall(struct.pack("=Q", len(value)) + value)
        else:
            return


def random_client(conn, rng):
    """Half the time the right answer to each query, else a mangled one."""
    while True:
        query = conn.recv(4096)
        if not query:
            return
        if len(query) >= 5 and query[-5] == PING:
            right = query[-4:]  # the echo (after VALIDATE, or after SET)
        elif query[0] == WAIT:
            right = bytes([STOP_WAITING])
        elif query[0] == ADD:
            right = struct.pack("=q", 1)
        elif query[0] == GET:
            right = struct.pack("=Q", 128) + bytes(rng.randrange(256) for _ in range(128))
        else:
            right = b""
        r = rng.random()
        if r < 0.5:
            out = right
        elif r < 0.6:
            return  # close
        elif r < 0.65:
            drain(conn)  # silence
            return
        elif r < 0.8:
            out = right[:rng.randrange(len(right) + 1)]  # cut short
        else:
            out = rng.choice([
                bytes([rng.choice([1, 127, 255])]),
                struct.pack("=Q", rng.choice([0, 1, 127, 129, 2**32, 2**63, 2**64 - 1])),
                bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))),
                right + b"\xff" * rng.randrange(1, 9),
            ])
        conn.sendall(out)


def handle(conn, store, mode, rng=None):
    with conn:
        try:
            if mode == "close":
                return
            if mode == "silent":
                drain(conn)
                return
            if mode in HOSTILE:
                hostile_client(conn, store, mode)
                return
            if mode == "random":
                random_client(conn, rng)
                return
            serve_client(conn, store)
        except (Closed, OSError):
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--mode", choices=("serve", "close", "silent", "random") + HOSTILE, default="serve")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log")
    ap.add_argument("--max-seconds", type=float, default=60.0)
    args = ap.parse_args()
    store = Store(args.log)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % server.getsockname()[1])
    os.rename(tmp, args.port_file)
    stop_at = time.monotonic() + args.max_seconds
    accepted = 0
    while time.monotonic() < stop_at:
        readable, _, _ = select.select([server], [], [], 0.1)
        if readable:
            conn, _ = server.accept()
            accepted += 1
            rng = random.Random(args.seed * 100003 + accepted)
            threading.Thread(target=handle, args=(conn, store, args.mode, rng), daemon=True).start()
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
