//! Fuzz the agent's side of the frame decoder: whatever a peer sends, decoding a `ClientFrame`
//! (first with the pre-authentication `Hello` cap, then with the full frame cap) never panics,
//! never accepts a frame above its cap, and a decoded frame re-encodes to a frame that decodes
//! to the same value.
#![no_main]

use guest_agent::agent::guard::MAX_HELLO_FRAME;
use vm_agent_protocol::frame::{decode_frame, encode_frame};
use vm_agent_protocol::protocol::{ClientFrame, MAX_FRAME};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for max in [MAX_HELLO_FRAME, MAX_FRAME] {
        if let Ok((f, used)) = decode_frame::<ClientFrame>(data, max) {
            assert!(used >= 4 && used <= data.len() && used - 4 <= max as usize);
            let again = encode_frame(&f, MAX_FRAME).expect("a decoded frame re-encodes");
            let (back, n) = decode_frame::<ClientFrame>(&again, MAX_FRAME).expect("and decodes");
            assert_eq!(back, f);
            assert_eq!(n, again.len());
        }
    }
});
