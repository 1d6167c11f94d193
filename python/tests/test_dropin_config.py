"""`mooncake.mooncake_config`: the expected values are what upstream's 0.3.13.post1 module
returns for the same inputs (run on its wheel). No master needed."""

import json

import pytest

from mooncake.mooncake_config import (
    DEFAULT_GLOBAL_SEGMENT_SIZE,
    DEFAULT_LOCAL_BUFFER_SIZE,
    MooncakeConfig,
    _parse_bool,
    _parse_segment_size,
)

ENV = [
    "MOONCAKE_CONFIG_PATH", "MOONCAKE_MASTER", "MOONCAKE_LOCAL_HOSTNAME",
    "MOONCAKE_TE_META_DATA_SERVER", "MOONCAKE_GLOBAL_SEGMENT_SIZE", "MOONCAKE_LOCAL_BUFFER_SIZE",
    "MOONCAKE_PROTOCOL", "MOONCAKE_DEVICE", "MOONCAKE_OFFLOAD_ENABLED",
    "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "MOONCAKE_TENANT_ID",
    "MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "MOONCAKE_CLIENT_HTTP_PORT",
]


@pytest.fixture
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("raw, expected", [
    (4096, 4096), ("4096", 4096), ("16MB", 16 << 20), ("16 mb", 16 << 20), ("1.5gb", 3 << 29),
    ("4k", 4096), ("2T", 2 << 40), ("100b", 100), ("3.125GB", DEFAULT_GLOBAL_SEGMENT_SIZE),
    ("1e3", 1000),
])
def test_sizes(raw, expected):
    assert _parse_segment_size(raw) == expected


@pytest.mark.parametrize("raw", ["", "mb", "50%", "lots"])
def test_bad_sizes_raise(raw):
    with pytest.raises(ValueError):
        _parse_segment_size(raw)


@pytest.mark.parametrize("raw, expected", [
    (True, True), (0, False), ("yes", True), ("OFF", False), ("enable", True), ("", False),
    (None, False), ("0", False),
])
def test_bools(raw, expected):
    assert _parse_bool(raw) is expected


def test_bad_bool_raises():
    with pytest.raises(ValueError):
        _parse_bool("maybe")


def test_from_file_defaults_and_normalisation(tmp_path):
    path = tmp_path / "mc.json"
    path.write_text(json.dumps({
        "local_hostname": "node1", "metadata_server": "P2PHANDSHAKE",
        "master_server_address": "10.0.0.1:50051", "protocol": "RDMA",
        "global_segment_size": "1gb", "enable_ssd_offload": "false", "tenant_id": None,
    }))
    c = MooncakeConfig.from_file(str(path))
    assert (c.local_hostname, c.protocol, c.global_segment_size) == ("node1", "rdma", 1 << 30)
    assert c.local_buffer_size == DEFAULT_LOCAL_BUFFER_SIZE
    assert (c.device_name, c.tenant_id, c.enable_ssd_offload) == ("", "default", False)
    assert (c.ssd_offload_path, c.enable_client_http_server, c.client_http_port) == ("", False, 9300)


def test_from_file_requires_the_three_addresses(tmp_path):
    path = tmp_path / "mc.json"
    path.write_text(json.dumps({"local_hostname": "a", "metadata_server": "b"}))
    with pytest.raises(ValueError, match="master_server_address"):
        MooncakeConfig.from_file(str(path))
    path.write_text(json.dumps({"local_hostname": " ", "metadata_server": "b",
                                "master_server_address": "c"}))
    with pytest.raises(ValueError, match="local_hostname"):
        MooncakeConfig.from_file(str(path))


def test_env_fallbacks(clean_env):
    with pytest.raises(ValueError, match="MOONCAKE_MASTER"):
        MooncakeConfig.load_from_env()
    clean_env.setenv("MOONCAKE_MASTER", "127.0.0.1:50051")
    c = MooncakeConfig.load_from_env()
    assert (c.local_hostname, c.metadata_server, c.protocol) == ("localhost", "P2PHANDSHAKE", "tcp")
    assert (c.global_segment_size, c.local_buffer_size) == (3355443200, 1073741824)
    clean_env.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "512mb")
    clean_env.setenv("MOONCAKE_OFFLOAD_ENABLED", "on")
    clean_env.setenv("MOONCAKE_CLIENT_HTTP_PORT", "9400")
    clean_env.setenv("MOONCAKE_TENANT_ID", "t1")
    c = MooncakeConfig.load_from_env()
    assert (c.global_segment_size, c.enable_ssd_offload) == (512 << 20, True)
    assert (c.client_http_port, c.tenant_id) == (9400, "t1")


def test_config_path_wins_over_env(clean_env, tmp_path):
    path = tmp_path / "mc.json"
    path.write_text(json.dumps({"local_hostname": "f", "metadata_server": "m",
                                "master_server_address": "x:1"}))
    clean_env.setenv("MOONCAKE_MASTER", "127.0.0.1:50051")
    clean_env.setenv("MOONCAKE_CONFIG_PATH", str(path))
    assert MooncakeConfig.load_from_env().master_server_address == "x:1"


def test_construction_checks():
    base = dict(local_hostname="h", metadata_server="m", global_segment_size=0,
                local_buffer_size=0, protocol="tcp", device_name=None,
                master_server_address="a:1")
    assert MooncakeConfig(**{**base, "protocol": " Tcp "}).protocol == "tcp"
    assert MooncakeConfig(**{**base, "protocol": "carrier-pigeon"}).protocol == "carrier-pigeon"
    for bad in ({"protocol": ""}, {"protocol": 3}, {"local_buffer_size": -1},
                {"master_server_address": ""}):
        with pytest.raises(ValueError):
            MooncakeConfig(**{**base, **bad})
