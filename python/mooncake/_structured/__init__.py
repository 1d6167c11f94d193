"""The implementation of `mooncake.structured_object_store`, split by job.

Import from `mooncake.structured_object_store`, the public module: it re-exports every name
defined here (upstream's names included, private ones too, since upstream's tests reach for
them). Calls from one part to an upstream-named helper of another go through that public
module (`common._public()`), so patching the helper there changes what the package does.

    common     constants, key/chunk checks, manifest and metadata JSON, write configs
    types      public data types and the DataProto ref handle
    inference  codec choice per column, `infer_structure`
    codecs     the per-row column codecs, schemas and the fallback search
    reads      how payload bytes come off the store: fast paths, registration, fallbacks
    bundles    manifests, chunked buffers, batched/parallel/zero-copy writes, reads
    members    structured-object members: tensors, arrays, bytes; how each is encoded
    materialize  reading one member back: slices, destinations, partial reads
    dataproto  DataProto sections, row counts, row selection
    transfer   `MooncakeBundleTransfer`
"""
