"""mooncake-rs: Mooncake's distributed KV-cache store, reimplemented in Rust.

`mooncake.store` is a drop-in replacement for upstream's module of the same name.
"""

# Like upstream: let other distributions contribute `mooncake.*` modules.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

# Upstream's package exports exactly these two (the same class).
from mooncake.buffer_pool import BufferPool, RegisteredBufferPool  # noqa: E402,F401

# Upstream's buffer_pool imports mooncake.store, so `import mooncake` alone makes
# `mooncake.store` usable there; the same here.
from mooncake import store  # noqa: E402,F401

__all__ = ["BufferPool", "RegisteredBufferPool"]
