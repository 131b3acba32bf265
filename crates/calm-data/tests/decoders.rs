//! The block object format's checks and the object store's URL, given any bytes or text,
//! answer with an error, never a panic: a damaged object is refused, not a crashed mount.

use bytes::Bytes;
use calm_data::ObjectsUrl;
use calm_data::block::verify;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn a_block_of_any_bytes_is_checked_or_refused(
        data_len in prop_oneof![0u32..300, any::<u32>()],
        header in prop::collection::vec(any::<u8>(), 0..64),
        fetched in prop::collection::vec(any::<u8>(), 0..300),
        from in prop_oneof![0u32..300, any::<u32>()],
        to in prop_oneof![0u32..300, any::<u32>()],
    ) {
        if let Ok(data) = verify(data_len, &header, Bytes::from(fetched), from, to) {
            prop_assert_eq!(data.len() as u64, u64::from(to - from));
        }
    }

    #[test]
    fn an_objects_url_of_any_text_parses_or_is_refused(text in "(file|s3|http)?(://)?[a-z0-9/?=&.:_-]{0,40}") {
        let _ = ObjectsUrl::parse(&text);
    }
}
