"""A failed store call still returns upstream's number, and the reason goes to stderr through
the native module's logger (`client::store::StoreError`, logged in `python/src/store.rs`): an
error line for a failure, nothing at the default level for a missing key, which a get or an
existence check asks about on purpose."""

from conftest import MIB, Master, make_store
from mooncake.error_codes import ErrorCode


def test_failed_calls_log_their_reason(capfd):
    # Its own master, so that no other test's segment can take the object.
    m = Master()
    try:
        s = make_store(m, segment=16 * MIB, local_buffer=64 * MIB)
        try:
            capfd.readouterr()
            rc = s.put("too-big", b"x" * (32 * MIB))
            assert rc < 0
            err = capfd.readouterr().err
            want = f"{ErrorCode(rc).name} ({rc}): put too-big: the master placed no 32 MiB x 1"
            assert want in err, err

            assert s.get("missing-key") == b""
            assert s.is_exist("missing-key") == 0
            assert "missing-key" not in capfd.readouterr().err

            # With the master gone, a get says which master it could not ask.
            assert m.stop() == 0
            assert s.get("after-master") == b""
            err = capfd.readouterr().err
            assert f"lookup of after-master: master {m.addr}" in err, err
        finally:
            s.close()
    finally:
        m.stop()


def test_failed_reads_log_their_reason(store, capfd):
    """The read paths (`get_into`, `batch_get_into`, the multi-buffer form) say why too."""
    import ctypes

    assert store.put("errlog/obj", b"y" * 1000) == 0
    buf = bytearray(4096)
    ptr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    assert store.register_buffer(ptr, len(buf)) == 0
    try:
        capfd.readouterr()
        assert store.get_into("errlog/obj", ptr, 100) == -600
        err = capfd.readouterr().err
        assert ("INVALID_PARAMS (-600): get_into errlog/obj: the object's 1000 bytes do not "
                "fit in the 100-byte buffer") in err, err

        assert store.batch_get_into(["errlog/obj"], [ptr], [10]) == [-600]
        err = capfd.readouterr().err
        assert "batch_get_into errlog/obj: the object's 1000 bytes do not fit in 10" in err, err

        assert store.batch_get_into_multi_buffers(["errlog/obj"], [[ptr, ptr + 8]], [[8]]) \
            == [-600]
        err = capfd.readouterr().err
        assert ("batch_get_into_multi_buffers errlog/obj: buffer and size lists differ in "
                "length") in err, err

        # A miss stays quiet at the default level, as for get.
        assert store.get_into("errlog/none", ptr, 100) == -704
        assert "errlog/none" not in capfd.readouterr().err
    finally:
        store.unregister_buffer(ptr)
        store.remove("errlog/obj", force=True)
