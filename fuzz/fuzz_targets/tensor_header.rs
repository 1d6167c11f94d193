//! Fuzzes the tensor object header decoder (`protocol::tensor`): nothing may panic, and a
//! header that decodes must re-encode to one that decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::tensor::TensorMetadata;

fuzz_target!(|data: &[u8]| {
    // The first 8 bytes pick the object's total length; the rest are the object's first bytes.
    let Some((len, bytes)) = data.split_first_chunk::<8>() else {
        return;
    };
    let extra = u64::from_le_bytes(*len) % (1 << 40);
    let total = bytes.len() as u64 + extra;
    for total in [bytes.len() as u64, total] {
        if let Ok(m) = TensorMetadata::decode(bytes, total) {
            let again = m.encode();
            assert_eq!(TensorMetadata::decode(&again, total), Ok(m));
        }
    }
});
