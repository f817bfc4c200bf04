//! Fuzz the host client's side of the frame decoder: whatever a (hostile) agent sends,
//! decoding an `AgentFrame` never panics, never accepts a frame above the cap, and a decoded
//! frame round-trips through the encoder.
#![no_main]

use vm_agent_protocol::frame::{decode_frame, encode_frame};
use vm_agent_protocol::protocol::{AgentFrame, MAX_FRAME};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((f, used)) = decode_frame::<AgentFrame>(data, MAX_FRAME) {
        assert!(used >= 4 && used <= data.len() && used - 4 <= MAX_FRAME as usize);
        let again = encode_frame(&f, MAX_FRAME).expect("a decoded frame re-encodes");
        let (back, n) = decode_frame::<AgentFrame>(&again, MAX_FRAME).expect("and decodes");
        assert_eq!(back, f);
        assert_eq!(n, again.len());
    }
});
