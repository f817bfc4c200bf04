//! Fuzz the snapshot state file decoder (`vmm::snapshot::format::decode`): hostile bytes must
//! be refused with an error, never a panic or an allocation sized by a length field; what
//! it accepts is a valid state whose re-encoding decodes again to the same bytes. The input
//! is decoded twice: as a whole file (header and checksum checks), and as a payload framed
//! with a correct header and digest (so the postcard decoder and the state's validation see
//! hostile bytes too, which a random file almost never gets past the SHA-256 to reach).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vmm::snapshot::format::{FORMAT_VERSION, decode, encode, frame};

fn check(file: &[u8]) {
    if let Ok(state) = decode(file) {
        assert!(state.validate().is_ok());
        let again = encode(&state).expect("a decoded state encodes");
        let back = decode(&again).expect("a re-encoded state decodes");
        assert_eq!(encode(&back).expect("encodes"), again);
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    check(&frame(data, FORMAT_VERSION));
});
