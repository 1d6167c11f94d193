"""One rank of a Mooncake EP test group (spawned by test_ep.py and test_ep_tcp.py; not
collected by pytest).

usage: ep_worker.py SCENARIO RANK WORLD PORT TMPDIR

Every rank builds every rank's inputs from seeds, so each computes the expected dispatch and
combine results itself, from the semantics (not from the code under test): for local expert
``l`` the rows come from sources in ascending order, tokens ascending, one row per (token,
expert) pair; ``layout_range[l, s] = begin << 32 | count``; combine is
``sum_k w[t, k] * expert_output(topk[t, k], t)`` over experts on active ranks. A failed check
raises; the last line on stdout is "OK <scenario> <checks>" on success.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from mooncake import mooncake_ep_buffer, pg
from mooncake.mooncake_ep_buffer import Buffer, EpArgumentError
from polling import process_gone, wait_until  # noqa: E402  (beside this script)

SCENARIO, RANK, WORLD, PORT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
TMP = sys.argv[5]
CHECKS = 0

T, H, K = 16, 256, 4
L = 3
E = L * WORLD


def check(cond, what):
    global CHECKS
    CHECKS += 1
    if not cond:
        raise AssertionError(f"rank {RANK}: {what}")


def expect_error(fn, words, what, kinds=(EpArgumentError, RuntimeError)):
    try:
        fn()
    except kinds as e:
        msg = str(e)
        check(all(w in msg for w in words), f"{what}: message {msg!r} lacks {words}")
        return
    raise AssertionError(f"rank {RANK}: {what}: no error")


def init():
    active = torch.ones(WORLD, dtype=torch.int32)
    dist.init_process_group(backend="mooncake", init_method=f"tcp://127.0.0.1:{PORT}",
                            rank=RANK, world_size=WORLD,
                            pg_options=pg.MooncakeBackendOptions(active))
    return active


def inputs(r, rnd):
    """Rank r's tokens in round rnd: a few -1 entries and a duplicated expert included.
    Rounds from EDGE_ROUNDS on carry fp8 edge cases (edge_rows) instead of normal values."""
    g = torch.Generator().manual_seed(7919 * rnd + r)
    n = T - (r + rnd) % 3
    x = torch.randn(n, H, generator=g).to(torch.bfloat16)
    if rnd >= EDGE_ROUNDS:
        x = edge_rows(n, g)
    topk = torch.randint(0, E, (n, K), generator=g)
    topk[0, K - 1] = -1
    topk[1, 1] = topk[1, 0]
    topk[2, :] = -1
    w = torch.rand(n, K, generator=g)
    return x, topk, w


EDGE_ROUNDS = 100
# the non-negative finite e4m3 values, increasing, and the midpoints between neighbours
E4M3_POS = torch.arange(0x7f, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
E4M3_MID = (E4M3_POS[:-1] + E4M3_POS[1:]) / 2


def edge_rows(n, g):
    """n bf16 rows of H = 2 groups, each row one kind of fp8 edge case (row t: kind t % 9)."""
    G = H // 128
    x = torch.zeros(n, G, 128)
    sign = lambda shape: torch.randint(0, 2, shape, generator=g).float() * 2 - 1  # noqa: E731
    for t in range(n):
        kind = t % 9
        if kind == 0:  # all zero, with negative zeros
            x[t] = torch.zeros(G, 128) * sign((G, 128))
        elif kind == 1:  # amax below the 1e-4 floor
            x[t] = torch.rand(G, 128, generator=g) * 9e-5 * sign((G, 128))
        elif kind == 2:  # amax 448 (k = 1) and 224 (k = 2): values on rounding midpoints
            mid = E4M3_MID[torch.randint(0, len(E4M3_MID), (G, 128), generator=g)]
            x[t] = mid * sign((G, 128)) / torch.tensor([1.0, 2.0])[:, None]
            x[t, :, 0] = torch.tensor([448.0, 224.0])
        elif kind == 3:  # 2^-30..2^0: many land in the e4m3 subnormals, some at f32's edge
            x[t] = 2.0 ** (torch.rand(G, 128, generator=g) * -30) * sign((G, 128))
        elif kind == 4:  # large values, up to bf16's largest finite
            x[t] = torch.rand(G, 128, generator=g) * 3.38e38 * sign((G, 128))
        elif kind == 5:  # an inf in group 0, a NaN in group 1
            x[t] = torch.randn(G, 128, generator=g)
            x[t, 0, 7] = float("inf") * sign((1,)).item()
            x[t, 1, 9] = float("nan")
        elif kind == 6:  # tiny negatives next to a large value: they round to -0
            x[t] = -torch.rand(G, 128, generator=g) * 1e-6
            x[t, :, 3] = 100.0
        elif kind == 8:  # normal values over six decades of amax
            x[t] = torch.randn(G, 128, generator=g) * 10.0 ** (torch.rand(G, 1, generator=g) * 6 - 3)
    x = x.view(n, H).to(torch.bfloat16)
    for t in range(7, n, 9):  # kind 7: any bf16 bit pattern (subnormals, inf, NaN included)
        x[t] = torch.randint(-32768, 32768, (H,), generator=g, dtype=torch.int16).view(
            torch.bfloat16)
    return x


def fp8_reference(rows):
    """The kernel's fp8 quantisation of bf16 rows [c, H] in torch ops, step by step:
    (e4m3 bytes as uint8 [c, H/128, 128], float32 scales [c, H/128])."""
    c = rows.shape[0]
    xs = rows.float().view(c, H // 128, 128)
    # fmaxf skips NaN (torch's amax would propagate it); 1e-4 floor
    amax = torch.where(xs.isnan(), 0.0, xs.abs()).amax(-1, keepdim=True).clamp(min=1e-4)
    # 448 / amax as one IEEE division: torch's `448.0 / amax` multiplies by the reciprocal
    k = torch.div(torch.full_like(amax, 448.0), amax)
    y = xs * k
    # satfinite: clamp first (torch's cast need not saturate), NaN -> 0x7f whatever its sign
    q = y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    q[y.isnan()] = 0x7F
    # the kernel's scale_inv = amax * kFP8AmaxInv, kFP8AmaxInv = 1.0f / 448.0f
    scales = amax * torch.tensor(1.0 / 448.0, dtype=torch.float32)
    return q, scales.view(c, -1)


def expert_out(e, rows):
    """What expert e returns for its input rows (bf16)."""
    return (rows.float() * (1.0 + 0.125 * e) - 0.01 * e).to(torch.bfloat16)


def expect_dispatch(rnd, active):
    """Per local expert: list of (source, token indices) and the concatenated rows."""
    want = []
    for l in range(L):
        e = RANK * L + l
        parts = []
        for s in range(WORLD):
            x, topk, _ = inputs(s, rnd)
            pos = (topk == e).any(dim=1).nonzero().flatten() if active[s] else torch.empty(
                0, dtype=torch.int64)
            parts.append((s, pos, x[pos]))
        want.append(parts)
    return want


def check_dispatch(rnd, active, recv_x, count, handle, fp8, what):
    src_info, layout, t_max, hidden, experts = handle
    check((t_max, hidden, experts) == (T, H, E), f"{what}: handle shape fields")
    n = WORLD * T
    check(src_info.shape == (L, n) and src_info.dtype == torch.int32, f"{what}: src_info")
    check(layout.shape == (L, WORLD) and layout.dtype == torch.int64, f"{what}: layout")
    check(count.shape == (L,) and count.dtype == torch.int32, f"{what}: count")
    if fp8:
        data, scales = recv_x
        check(data.dtype == torch.float8_e4m3fn and data.shape == (L, n, H), f"{what}: fp8")
        check(scales.dtype == torch.float32 and scales.shape == (L, n, H // 128),
              f"{what}: scales")
    else:
        check(recv_x.dtype == torch.bfloat16 and recv_x.shape == (L, n, H), f"{what}: bf16")
    for l, parts in enumerate(expect_dispatch(rnd, active)):
        begin = 0
        for s, pos, rows in parts:
            c = len(pos)
            got = layout[l, s].item()
            check(got == ((begin << 32) | c if c else 0),
                  f"{what}: layout_range[{l},{s}] = {got:#x}, want begin {begin} count {c}")
            check(torch.equal(src_info[l, begin:begin + c], pos.to(torch.int32)),
                  f"{what}: src_info[{l}] from {s}")
            if not fp8:
                check(torch.equal(recv_x[l, begin:begin + c], rows),
                      f"{what}: bf16 rows of expert {l} from {s}")
            else:
                data, scales = recv_x
                q, want_scales = fp8_reference(rows)
                got_s = scales[l, begin:begin + c]
                check(torch.equal(got_s.view(torch.int32), want_scales.view(torch.int32)),
                      f"{what}: fp8 scales of expert {l} from {s}")
                got_q = data[l, begin:begin + c].view(c, H // 128, 128)
                bad = (got_q.view(torch.uint8) != q).nonzero()
                check(len(bad) == 0, f"{what}: fp8 bytes of expert {l} from {s}: "
                      f"{len(bad)} differ, first at {bad[:4].tolist()}")
                xs = rows.float().view(c, H // 128, 128)
                deq = got_q.float() * got_s.view(c, -1, 1)
                bound = xs.abs() / 16 + got_s.view(c, -1, 1) / 512
                fin = torch.isfinite(xs).all(-1, keepdim=True)  # groups without inf or NaN
                check(bool(((deq - xs).abs() <= bound)[fin.expand_as(xs)].all()),
                      f"{what}: fp8 error bound of expert {l} from {s}")
            begin += c
        check(count[l].item() == begin, f"{what}: recv_count[{l}] {count[l].item()} != {begin}")
        check(bool((src_info[l, begin:] == -1).all()), f"{what}: src_info tail is -1")


def expected_combine(rnd, active):
    x, topk, w = inputs(RANK, rnd)
    acc = torch.zeros(x.shape[0], H, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(K):
            e = topk[t, j].item()
            if e < 0 or not active[e // L]:
                continue
            acc[t] += expert_out(e, x[t:t + 1])[0].double() * w[t, j].item()
    return acc


def check_combine(got, want, what):
    check(got.dtype == torch.bfloat16 and got.shape == want.shape, f"{what}: shape/dtype")
    err = (got.double() - want).abs()
    ok = bool((err <= want.abs() * 2.0 ** -8 + 1e-3).all())
    check(ok, f"{what}: max error {err.max().item()}")


def outputs_for(recv_x, count):
    """This rank's experts applied to the received rows (what a model would compute)."""
    y = torch.zeros_like(recv_x)
    for l in range(L):
        c = count[l].item()
        y[l, :c] = expert_out(RANK * L + l, recv_x[l, :c])
    return y


def new_buffer():
    size = Buffer.get_ep_buffer_size_hint(T, H, WORLD, E)
    check(size == 16 * E + 4 * E * T * (32 + 2 * H), "size hint formula")
    buf = Buffer(group=dist.group.WORLD, num_ep_buffer_bytes=size)
    hosts = os.environ.get("EP_HOSTS")  # test_ep_tcp: the host of each rank, e.g. "aab"
    if hosts:
        want = [r for r, h in enumerate(hosts) if h != hosts[RANK]]
        check(buf.runtime.remote_ranks == want,
              f"linked over TCP to {buf.runtime.remote_ranks}, want {want}")
    return buf


def one_round(buf, rnd, active, what, timeout_us=5_000_000, **kw):
    """A dispatch and a combine checked against the reference (active=None: the group's)."""
    live = [1] * WORLD if active is None else active.tolist()
    x, topk, w = inputs(RANK, rnd)
    recv_x, count, handle, event, hook = buf.dispatch(
        x, topk, active, T, E, timeout_us, use_fp8=False, **kw)
    hook()
    event.current_stream_wait()
    check_dispatch(rnd, live, recv_x, count, handle, False, what)
    y = outputs_for(recv_x, count)
    out, event, hook = buf.combine(y, topk, w, active, timeout_us, handle, **kw)
    hook()
    check_combine(out, expected_combine(rnd, live), f"{what} combine")
    return handle, y


def scenario_basic():
    """bf16 and fp8 dispatch, combine, hook and async modes, zero-copy, double buffering over
    several rounds, active_ranks forms, update_ep_member."""
    init()
    buf = new_buffer()
    active = torch.ones(WORLD, dtype=torch.int32)
    for rnd in range(4):  # consecutive calls alternate the two buffer sets
        one_round(buf, rnd, active, f"round {rnd}")
    check(active.tolist() == [1] * WORLD, "nobody marked")

    # fp8 (the default: use_fp8=None)
    x, topk, w = inputs(RANK, 10)
    recv_x, count, handle, _, _ = buf.dispatch(x, topk, active, T, E, 5_000_000)
    check(isinstance(recv_x, tuple), "use_fp8=None dispatches fp8")
    check_dispatch(10, [1] * WORLD, recv_x, count, handle, True, "fp8")

    # hook mode: nothing is received until the hook runs
    x, topk, w = inputs(RANK, 11)
    recv_x, count, handle, event, hook = buf.dispatch(
        x, topk, active, T, E, 5_000_000, use_fp8=False, return_recv_hook=True)
    check(event.event is None, "no event without async_finish")
    hook()
    check_dispatch(11, [1] * WORLD, recv_x, count, handle, False, "hook dispatch")
    y = outputs_for(recv_x, count)
    out, _, chook = buf.combine(y, topk, w, active, 5_000_000, handle, return_recv_hook=True)
    chook()
    chook()  # a second call does nothing
    check_combine(out, expected_combine(11, [1] * WORLD), "hook combine")

    # async_finish: a completed event and the tensors it keeps alive
    x, topk, w = inputs(RANK, 12)
    recv_x, count, handle, event, hook = buf.dispatch(
        x, topk, active, T, E, 5_000_000, use_fp8=False, async_finish=True)
    check(isinstance(event.event, mooncake_ep_buffer.EventHandle), "async event")
    check(event.extra_tensors is not None and len(event.extra_tensors) == 7, "extra tensors")
    event.current_stream_wait()
    with event:
        pass
    check_dispatch(12, [1] * WORLD, recv_x, count, handle, False, "async dispatch")

    # zero-copy combine: expert outputs written into the buffer get_next_combine_buffer gives
    y = outputs_for(recv_x, count)
    zbuf = buf.get_next_combine_buffer(handle)
    check(zbuf.shape == (L, WORLD * T, H) and zbuf.dtype == torch.bfloat16, "combine buffer")
    zbuf.copy_(y)
    target = torch.empty(x.shape[0], H, dtype=torch.bfloat16)
    out, event, _ = buf.combine(None, topk, w, active, 5_000_000, handle, zero_copy=True,
                                async_finish=True, out=target)
    check(out.data_ptr() == target.data_ptr(), "combine writes into out")
    check_combine(out, expected_combine(12, [1] * WORLD), "zero-copy combine")

    # active_ranks=None (from the group) and a wrong-sized tensor (replaced by all-ones)
    one_round(buf, 13, None, "active from the group")
    odd = torch.zeros(WORLD + 5, dtype=torch.int32)
    x, topk, w = inputs(RANK, 14)
    recv_x, count, handle, _, _ = buf.dispatch(x, topk, odd, T, E, 5_000_000, use_fp8=False)
    check_dispatch(14, [1] * WORLD, recv_x, count, handle, False, "wrong-sized active_ranks")
    check(odd.tolist() == [0] * (WORLD + 5), "the wrong-sized tensor is left alone")
    buf.combine(outputs_for(recv_x, count), topk, w, odd, 5_000_000, handle)

    # update_ep_member: fresh buffers on every rank, calls go on
    buf.update_ep_member()
    one_round(buf, 15, active, "after update_ep_member")
    one_round(buf, 16, active, "after update_ep_member, second")
    dist.barrier()


def scenario_dead():
    """The last rank builds its Buffer and never dispatches: the others return after
    timeout_us with it marked 0 and its tokens/experts left out. Then it exits, and a dispatch
    with no timeout still returns (its process is gone)."""
    init()
    buf = new_buffer()
    victim = WORLD - 1
    flag = os.path.join(TMP, "phase1")
    pid_file = os.path.join(TMP, "victim.pid")
    if RANK == victim:
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)  # the survivors never read half a pid
        wait_until(lambda: os.path.exists(flag), 30, "rank 0's phase-1 flag")
        print(f"OK {SCENARIO} {CHECKS}", flush=True)
        if os.environ.get("EP_VICTIM_SIGKILL") == "1":  # test_ep_tcp: no orderly exit
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(0)
    active = torch.ones(WORLD, dtype=torch.int32)
    x, topk, w = inputs(RANK, 20)
    t0 = time.monotonic()
    recv_x, count, handle, _, _ = buf.dispatch(x, topk, active, T, E, 300_000, use_fp8=False)
    took = time.monotonic() - t0
    check(0.3 <= took < 3.0, f"dispatch returned after {took:.3f}s, timeout 0.3 s")
    want_active = [int(r != victim) for r in range(WORLD)]
    check(active.tolist() == want_active, f"active_ranks {active.tolist()}")
    check_dispatch(20, want_active, recv_x, count, handle, False, "dispatch without the dead")
    y = outputs_for(recv_x, count)
    t0 = time.monotonic()
    out, _, _ = buf.combine(y, topk, w, active, 5_000_000, handle)
    check(time.monotonic() - t0 < 2.5, "combine does not wait for a rank already marked")
    check_combine(out, expected_combine(20, want_active), "combine without the dead")
    # between the survivors only: the group's barrier would wait for the dead rank
    if RANK == 0:
        open(flag, "w").close()
    # the victim exits: its process gone (a zombie counts: its lock and sockets are closed)
    wait_until(lambda: os.path.exists(pid_file) and process_gone(int(open(pid_file).read())),
               30, "the victim's exit")
    fresh = torch.ones(WORLD, dtype=torch.int32)
    x, topk, w = inputs(RANK, 21)
    t0 = time.monotonic()
    recv_x, count, handle, _, _ = buf.dispatch(x, topk, fresh, T, E, -1, use_fp8=False)
    check(time.monotonic() - t0 < 5.0, "no timeout: a dead rank is noticed by its lock")
    check(fresh.tolist() == want_active, f"dead rank marked: {fresh.tolist()}")
    check_dispatch(21, want_active, recv_x, count, handle, False, "dispatch after the exit")
    out, _, _ = buf.combine(outputs_for(recv_x, count), topk, w, fresh, -1, handle)
    check_combine(out, expected_combine(21, want_active), "combine after the exit")


def scenario_bad_input():
    """Bad arguments are refused with a clear error before anything is sent; the buffer works
    afterwards. A group whose ranks claim different hosts links them over TCP."""
    init()
    buf = new_buffer()
    active = torch.ones(WORLD, dtype=torch.int32)
    x, topk, w = inputs(RANK, 30)
    d = lambda *a, **kw: buf.dispatch(*a, **kw)  # noqa: E731
    expect_error(lambda: d(x.float(), topk, active, T, E, -1), ["bfloat16", "float32"],
                 "float32 x")
    expect_error(lambda: d(x, topk.int(), active, T, E, -1), ["int64", "int32"], "int32 topk")
    expect_error(lambda: d(torch.zeros(4, 100, dtype=torch.bfloat16), topk[:4], active, T, E,
                           -1), ["multiple of 128", "100"], "hidden 100")
    big = torch.zeros(T + 1, H, dtype=torch.bfloat16)
    expect_error(lambda: d(big, torch.zeros(T + 1, K, dtype=torch.int64), active, T, E, -1),
                 ["17 tokens", "16"], "too many tokens")
    expect_error(lambda: d(x, topk, active, T, E + 1, -1), ["multiple of the group size"],
                 "experts not a multiple of ranks")
    expect_error(lambda: d(x, topk[:-1], active, T, E, -1), ["topk_idx has"], "row mismatch")
    bad = topk.clone()
    bad[3, 0] = E
    expect_error(lambda: d(x, bad, active, T, E, -1, use_fp8=False), ["topk_idx[3, 0]", str(E)],
                 "expert out of range")
    expect_error(lambda: d(x, topk, active, T, E, -1, async_finish=True, return_recv_hook=True),
                 ["cannot both"], "async and hook")
    expect_error(lambda: d(x, topk, active.long(), T, E, -1), ["int32"], "int64 active_ranks")
    expect_error(lambda: d(x, topk, active, T, E, -7), ["timeout_us"], "timeout -7")
    expect_error(lambda: d(x, topk, active, 4 * T, E, -1), ["too small", "get_ep_buffer"],
                 "buffer too small for the shape")
    check(isinstance(EpArgumentError("x"), AssertionError), "argument errors are assertions")

    # a valid round still works, and combine's checks
    x, topk, w = inputs(RANK, 31)
    recv_x, count, handle, _, _ = buf.dispatch(x, topk, active, T, E, 5_000_000,
                                               use_fp8=False)
    check_dispatch(31, [1] * WORLD, recv_x, count, handle, False, "after bad input")
    y = outputs_for(recv_x, count)
    c = lambda *a, **kw: buf.combine(*a, **kw)  # noqa: E731
    expect_error(lambda: c(y.float(), topk, w, active, -1, handle), ["bfloat16"], "float x")
    expect_error(lambda: c(y[:, :-1].contiguous(), topk, w, active, -1, handle), ["shape"],
                 "x shape")
    expect_error(lambda: c(y, topk, w.double(), active, -1, handle), ["float32"], "weights")
    expect_error(lambda: c(y, topk, w[:, :-1].contiguous(), active, -1, handle),
                 ["topk_weights has shape"], "weights shape")
    expect_error(lambda: c(y, topk, w, active, -1, handle,
                           out=torch.empty(1, H, dtype=torch.bfloat16)), ["out must"], "out")
    out, _, _ = c(y, topk, w, active, 5_000_000, handle)
    check_combine(out, expected_combine(31, [1] * WORLD), "combine after bad input")

    # a rank on another host is linked over TCP (this rank pretends to be elsewhere)
    if RANK == 1:
        mooncake_ep_buffer._host_id = lambda: "elsewhere/boot"
    one_round(new_buffer(), 32, active, "cross-host buffer")
    dist.barrier()


def scenario_fp8():
    """fp8 dispatch of edge-case rows (edge_rows), bit for bit against fp8_reference, and a
    bf16 dispatch of the same rows in between (it must carry them unchanged, NaNs too)."""
    init()
    buf = new_buffer()
    active = torch.ones(WORLD, dtype=torch.int32)
    for rnd in range(EDGE_ROUNDS, EDGE_ROUNDS + 6):
        x, topk, _ = inputs(RANK, rnd)
        fp8 = rnd % 3 != 2
        recv_x, count, handle, _, _ = buf.dispatch(x, topk, active, T, E, 5_000_000,
                                                   use_fp8=fp8)
        if fp8:
            check_dispatch(rnd, [1] * WORLD, recv_x, count, handle, True, f"edge round {rnd}")
        else:
            for l, parts in enumerate(expect_dispatch(rnd, [1] * WORLD)):
                rows = torch.cat([p[2] for p in parts])
                got = recv_x[l, :len(rows)]
                check(torch.equal(got.view(torch.int16), rows.view(torch.int16)),
                      f"edge round {rnd}: bf16 rows of expert {l}")
    dist.barrier()


SCENARIOS = {"fp8": scenario_fp8, "basic": scenario_basic, "dead": scenario_dead, "bad_input": scenario_bad_input}

if __name__ == "__main__":
    SCENARIOS[SCENARIO]()
    print(f"OK {SCENARIO} {CHECKS}", flush=True)
    sys.stdout.flush()
    os._exit(0)
