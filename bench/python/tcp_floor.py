"""Plain sockets moving only each op's bytes: ``pg_bench.py``'s ``tcp-floor``.

Plain sockets between every pair of ranks (one connection per pair, used both ways), and per
op only the bytes the bandwidth-optimal algorithm must move between ranks: all_reduce sends
2(n-1)/n of the tensor per rank (a direct reduce-scatter, then a direct all-gather: the bytes
of Gloo's ring), all_gather and all_to_all (n-1)/n. Every byte is sent straight from the
tensor and received straight into its destination, each send and receive on its own thread
so that all of a rank's transfers run at once. Nothing else: no fold (all_reduce's result is
wrong), no copy of a rank's own piece, no framing, no failure handling. So it is a
reference, not a backend: what these bytes' two kernel copies (into and out of the socket)
cost on the machine with default socket settings, ``floor / gloo`` about the largest
speed-up over Gloo a TCP implementation can show here, and ``ours / floor`` what our
protocol adds. It is not a strict bound: with more ranks than cores, its threads (two per
peer, Python's) wake more often than a tuned sender, and ``mooncake-tcp`` has measured below
it at 4 ranks on 2 cores (``bench/README.md``).
"""

import socket
from concurrent.futures import ThreadPoolExecutor


def _sendall(sock, mv):
    sock.sendall(mv)


def _recv_into(sock, mv):
    got = 0
    while got < len(mv):
        n = sock.recv_into(mv[got:])
        if n == 0:
            raise ConnectionError("peer closed")
        got += n


class Floor:
    """A full mesh of TCP connections among the ranks of ``dist``'s default group."""

    def __init__(self, dist, ip):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        lst = socket.socket()
        lst.bind((ip, 0))
        lst.listen(self.world)
        addrs = [None] * self.world
        dist.all_gather_object(addrs, (ip, lst.getsockname()[1]))
        self.peers = {}
        for j in range(self.rank):  # connect to lower ranks, accept from higher ones
            s = socket.create_connection(addrs[j])
            s.sendall(self.rank.to_bytes(4, "little"))
            self.peers[j] = s
        for _ in range(self.rank + 1, self.world):
            s, _ = lst.accept()
            buf = bytearray(4)
            _recv_into(s, memoryview(buf))
            self.peers[int.from_bytes(buf, "little")] = s
        lst.close()
        for s in self.peers.values():
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.others = [j for j in range(self.world) if j != self.rank]
        self.pool = ThreadPoolExecutor(max_workers=2 * max(1, len(self.others)))

    def _exchange(self, send, recv):
        """Send ``send(j)`` to and receive ``recv(j)`` from every other rank, all at once."""
        fs = [self.pool.submit(_sendall, self.peers[j], _bytes(send(j))) for j in self.others]
        fs += [self.pool.submit(_recv_into, self.peers[j], _bytes(recv(j))) for j in self.others]
        for f in fs:
            f.result()

    def _pieces(self, t):
        k = t.numel() // self.world
        return [t[j * k:(j + 1) * k] for j in range(self.world)]

    def all_reduce(self, t):
        part, me = self._pieces(t), self.rank
        self._exchange(lambda j: part[j], lambda j: part[j])  # reduce-scatter's bytes
        self._exchange(lambda j: part[me], lambda j: part[j])  # all-gather's bytes

    def all_gather_into_tensor(self, out, inp):
        part = self._pieces(out)
        self._exchange(lambda j: inp, lambda j: part[j])

    def all_to_all_single(self, out, inp):
        src, dst = self._pieces(inp), self._pieces(out)
        self._exchange(lambda j: src[j], lambda j: dst[j])

    def close(self):
        self.pool.shutdown()
        for s in self.peers.values():
            s.close()


def _bytes(t):
    return memoryview(t.numpy()).cast("B")


def stream_cost(mib=256, rounds=5):
    """CPU seconds (sender and receiver together) per GiB one loopback TCP stream costs,
    with the sender and the receiver in two processes, default socket buffers and nothing
    else: the kernel's price of a byte through TCP here, as a plain program pays it (larger
    buffers and fewer wake-ups pay less)."""
    import os
    import time

    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    port = lst.getsockname()[1]
    size = mib << 20
    pid = os.fork()
    if pid == 0:  # the sender
        lst.close()
        s = socket.create_connection(("127.0.0.1", port))
        buf = memoryview(bytearray(size))
        for _ in range(rounds + 1):
            s.sendall(buf)
        s.close()
        os._exit(0)
    conn, _ = lst.accept()
    buf = memoryview(bytearray(size))
    _recv_into(conn, buf)  # a warm-up round, not counted
    t0, c0 = time.perf_counter(), os.times()
    for _ in range(rounds):
        _recv_into(conn, buf)
    wall = time.perf_counter() - t0
    os.waitpid(pid, 0)
    c1 = os.times()
    # The sender's time comes in whole at its exit: its share of the counted rounds.
    children = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
    sender = children * rounds / (rounds + 1)
    cpu = (c1.user - c0.user) + (c1.system - c0.system) + sender
    gib = rounds * size / (1 << 30)
    return cpu / gib, wall / gib


if __name__ == "__main__":
    cpu, wall = stream_cost()
    print(f"one loopback TCP stream: {cpu * 1000:.0f} ms of CPU per GiB (sender and receiver), "
          f"{1 / wall:.2f} GiB/s")
