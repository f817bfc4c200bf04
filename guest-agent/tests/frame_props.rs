//! Property tests of the frame decoder on both sides: arbitrary peer bytes never panic the
//! agent (decoding `ClientFrame`, under the pre-authentication `Hello` cap and the full cap)
//! or the client (decoding `AgentFrame`), never yield a frame above the cap, and a length
//! prefix above the cap is refused whatever follows it (so nothing of that size is ever
//! allocated). The streaming reader agrees with the pure decoder.

use guest_agent::agent::guard::MAX_HELLO_FRAME;
use proptest::prelude::*;
use vm_agent_protocol::frame::{FrameError, FrameReader, decode_frame, encode_frame};
use vm_agent_protocol::protocol::{AgentFrame, ClientFrame, MAX_FRAME};

fn check<T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug>(
    bytes: &[u8],
    max: u32,
) {
    match decode_frame::<T>(bytes, max) {
        Ok((f, used)) => {
            assert!(used >= 4 && used <= bytes.len() && used - 4 <= max as usize);
            let again = encode_frame(&f, MAX_FRAME).unwrap();
            assert_eq!(decode_frame::<T>(&again, MAX_FRAME).unwrap().0, f);
        }
        Err(FrameError::TooLarge { len, max: m }) => assert!(len > u64::from(m)),
        Err(_) => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn arbitrary_bytes_never_panic_either_side(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        check::<ClientFrame>(&bytes, MAX_HELLO_FRAME);
        check::<ClientFrame>(&bytes, MAX_FRAME);
        check::<AgentFrame>(&bytes, MAX_FRAME);
    }

    #[test]
    fn plausible_frames_never_panic(len in 0u32..64, body in proptest::collection::vec(any::<u8>(), 0..64)) {
        // A well-formed prefix in front of arbitrary bodies reaches postcard more often.
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend(&body);
        check::<ClientFrame>(&bytes, MAX_HELLO_FRAME);
        check::<AgentFrame>(&bytes, MAX_FRAME);
    }

    #[test]
    fn oversized_prefix_is_refused_before_the_body(len in (MAX_HELLO_FRAME + 1)..=u32::MAX, tail in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend(&tail);
        let too_large = matches!(
            decode_frame::<ClientFrame>(&bytes, MAX_HELLO_FRAME),
            Err(FrameError::TooLarge { .. })
        );
        prop_assert!(too_large);
    }

    #[test]
    fn streaming_reader_agrees_with_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let streamed: Result<ClientFrame, FrameError> = rt.block_on(async {
            let mut r = &bytes[..];
            FrameReader::new(MAX_HELLO_FRAME)
                .read(&mut r, None, std::time::Duration::from_secs(1))
                .await
        });
        let decoded = decode_frame::<ClientFrame>(&bytes, MAX_HELLO_FRAME);
        match (streamed, decoded) {
            (Ok(a), Ok((b, _))) => prop_assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            (a, b) => prop_assert!(false, "reader {a:?} vs decoder {b:?}"),
        }
    }
}
