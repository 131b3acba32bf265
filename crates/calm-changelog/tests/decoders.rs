//! The changelog's decoders, given any bytes or text, answer with an error (or nothing), never
//! a panic: a damaged record is reported, not a crashed reader.

use calm_changelog::{Mask, Record, User, UserId};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn a_record_of_any_bytes_decodes_or_is_refused(index in any::<u64>(), bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(record) = Record::decode(index, &bytes) {
            prop_assert_eq!(record.index, index);
        }
    }

    #[test]
    fn a_reader_of_any_bytes_decodes_or_is_refused(id in any::<u32>(), bytes in prop::collection::vec(any::<u8>(), 0..80)) {
        let _ = User::decode(id as UserId, &bytes);
    }

    #[test]
    fn a_mask_or_a_reader_label_of_any_text_parses_or_is_refused(text in "[a-zA-Z0-9_,+ -]{0,40}") {
        let _ = Mask::parse(&text);
        let _ = User::parse_label(&text);
    }
}
