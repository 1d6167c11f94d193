"""`mooncake.mooncake_config`: a store client's settings from a JSON file or the environment.

`MooncakeConfig.load_from_env()` reads the JSON file named by `MOONCAKE_CONFIG_PATH`; without
it, `MOONCAKE_MASTER` (required) and the other `MOONCAKE_*` variables below. Sizes are bytes as
an int or a string with a binary suffix (`"3.125GB"`, `"512 mb"`, `"4k"`, `"100b"`); booleans
accept `true/false`, `1/0`, `yes/no`, `on/off`, `enable/disable`. Construction lower-cases the
protocol (an unknown one is passed on with a warning), and rejects negative sizes and empty
hostname, metadata server or master address with ValueError.

| field                     | JSON key (file)           | environment variable                 | default        |
|---------------------------|---------------------------|--------------------------------------|----------------|
| local_hostname            | local_hostname (required) | MOONCAKE_LOCAL_HOSTNAME              | "localhost"    |
| metadata_server           | metadata_server (req.)    | MOONCAKE_TE_META_DATA_SERVER         | "P2PHANDSHAKE" |
| global_segment_size       | global_segment_size       | MOONCAKE_GLOBAL_SEGMENT_SIZE         | 3355443200     |
| local_buffer_size         | local_buffer_size         | MOONCAKE_LOCAL_BUFFER_SIZE           | 1073741824     |
| protocol                  | protocol                  | MOONCAKE_PROTOCOL                    | "tcp"          |
| device_name               | device_name               | MOONCAKE_DEVICE                      | ""             |
| master_server_address     | master_server_address (r) | MOONCAKE_MASTER (required)           |                |
| enable_ssd_offload        | enable_ssd_offload        | MOONCAKE_OFFLOAD_ENABLED             | False          |
| ssd_offload_path          | ssd_offload_path          | MOONCAKE_OFFLOAD_FILE_STORAGE_PATH   | ""             |
| tenant_id                 | tenant_id                 | MOONCAKE_TENANT_ID                   | "default"      |
| enable_client_http_server | enable_client_http_server | MOONCAKE_ENABLE_CLIENT_HTTP_SERVER   | False          |
| client_http_port          | client_http_port          | MOONCAKE_CLIENT_HTTP_PORT            | 9300           |

`setup_store(store)` hands a config to `MooncakeDistributedStore.setup`. Note that this build
refuses the SSD offload and the client HTTP server at setup
(see python/README.md): a config asking for them fails there, loudly.
"""

import json
import logging
import os
from dataclasses import dataclass
from typing import Optional

logger = logging.getLogger(__name__)

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824  # 1 GiB

# Longest suffix first, so "kb" is not read as "b".
_UNITS = (("kb", 1 << 10), ("mb", 1 << 20), ("gb", 1 << 30), ("tb", 1 << 40),
          ("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30), ("t", 1 << 40), ("b", 1))
_TRUE = frozenset(("true", "1", "yes", "on", "enable"))
_FALSE = frozenset(("false", "0", "no", "off", "disable"))
_PROTOCOLS = frozenset((
    "tcp", "rdma", "efa", "nvmeof", "nvlink", "musa", "nvlink_intra", "hip", "barex", "cxl",
    "ascend", "ub", "ubshmem", "maca", "sunrise_link", "rpc_only",
))
_REQUIRED = ("local_hostname", "metadata_server", "master_server_address")


def _parse_segment_size(value) -> int:
    """Bytes of a size given as an int or a string such as "16MB" (binary multiples)."""
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return int(value)
    text = value.strip().lower()
    if not text:
        raise ValueError("Invalid segment size: empty string")
    for unit, scale in _UNITS:
        if text.endswith(unit):
            number = text[: -len(unit)].strip()
            if not number:
                raise ValueError(f"Invalid segment size: missing number before '{unit}'")
            return int(float(number) * scale)
    return int(float(text))


def _parse_bool(value) -> bool:
    """A boolean given as a bool, a number or a word; ValueError for any other word."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if value is None:
        return False
    word = str(value).strip().lower()
    if not word or word in _FALSE:
        return False
    if word in _TRUE:
        return True
    raise ValueError(f"Invalid boolean value: {value!r}")


@dataclass
class MooncakeConfig:
    """Settings of one store client (see the module docs for keys and defaults)."""

    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: Optional[str]
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self):
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(
                f"Invalid protocol: {self.protocol!r}; expected a non-empty string such as "
                "'tcp' or 'rdma'."
            )
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in _PROTOCOLS:
            logger.warning("Unrecognised protocol %r, passed on unchanged (known: %s).",
                           self.protocol, ", ".join(sorted(_PROTOCOLS)))
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"Invalid {name}: {getattr(self, name)}; sizes are >= 0.")
        for name in _REQUIRED:
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"Config field {name!r} must be a non-empty string, "
                                 f"got {value!r}.")

    @staticmethod
    def from_file(file_path: str) -> "MooncakeConfig":
        """The config in a JSON file; ValueError when a required key is missing."""
        with open(file_path) as f:
            raw = json.load(f)
        missing = [k for k in _REQUIRED if k not in raw]
        if missing:
            raise ValueError(f"Missing required config field: {missing[0]}")
        path, tenant = raw.get("ssd_offload_path"), raw.get("tenant_id")
        return MooncakeConfig(
            local_hostname=raw["local_hostname"],
            metadata_server=raw["metadata_server"],
            global_segment_size=_parse_segment_size(
                raw.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=_parse_segment_size(
                raw.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=raw.get("protocol", "tcp"),
            device_name=raw.get("device_name", ""),
            master_server_address=raw["master_server_address"],
            enable_ssd_offload=_parse_bool(raw.get("enable_ssd_offload", False)),
            ssd_offload_path="" if path is None else str(path),
            tenant_id="default" if tenant is None else str(tenant),
            enable_client_http_server=_parse_bool(raw.get("enable_client_http_server", False)),
            client_http_port=int(raw.get("client_http_port", 9300)),
        )

    @staticmethod
    def load_from_env() -> "MooncakeConfig":
        """The file named by MOONCAKE_CONFIG_PATH, else the MOONCAKE_* variables."""
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path is not None:
            return MooncakeConfig.from_file(path)
        master = os.getenv("MOONCAKE_MASTER")
        if not master:
            raise ValueError(
                "Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor "
                "'MOONCAKE_MASTER' is set."
            )
        env = os.getenv
        return MooncakeConfig(
            local_hostname=env("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=env("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=_parse_segment_size(
                env("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=_parse_segment_size(
                env("MOONCAKE_LOCAL_BUFFER_SIZE", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=env("MOONCAKE_PROTOCOL", "tcp"),
            device_name=env("MOONCAKE_DEVICE", ""),
            master_server_address=master,
            enable_ssd_offload=_parse_bool(env("MOONCAKE_OFFLOAD_ENABLED", "false")),
            ssd_offload_path=env("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=env("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=_parse_bool(
                env("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false")),
            client_http_port=int(env("MOONCAKE_CLIENT_HTTP_PORT", 9300)),
        )

    def setup_store(self, store) -> int:
        """`store.setup(...)` with this config; its return code."""
        return store.setup(
            self.local_hostname,
            self.metadata_server,
            self.global_segment_size,
            self.local_buffer_size,
            self.protocol,
            self.device_name or "",
            self.master_server_address,
            enable_ssd_offload=self.enable_ssd_offload,
            ssd_offload_path=self.ssd_offload_path,
            tenant_id=self.tenant_id,
            enable_client_http_server=self.enable_client_http_server,
            client_http_port=self.client_http_port,
        )
