//! Every decoder of the vocabulary's formats, given any bytes, answers with an error (or
//! nothing), never a panic: a damaged chunk value or a hostile request id must not take a
//! server down.

use calm_types::slices::{SLICE_RECORD_BYTES, decode_chunk, encode_chunk};
use calm_types::{Groups, MetaError, RequestId};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn a_chunk_value_of_any_bytes_decodes_or_is_refused(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        match decode_chunk(&bytes) {
            Ok(slices) => {
                prop_assert_eq!(bytes.len() % SLICE_RECORD_BYTES, 0);
                prop_assert_eq!(encode_chunk(&slices), bytes);
            }
            Err(error) => prop_assert!(matches!(error, MetaError::Corrupt(_))),
        }
    }

    #[test]
    fn an_error_code_and_detail_of_any_value_decode_or_are_refused(code in any::<u32>(), detail in ".{0,40}") {
        if let Some(error) = MetaError::from_code(code, &detail) {
            prop_assert_eq!(error.code(), code);
        }
    }

    #[test]
    fn a_request_id_of_any_text_parses_or_is_refused(text in "[0-9a-fA-F:xz-]{0,60}") {
        if let Some(id) = RequestId::from_text(&text) {
            prop_assert_eq!(RequestId::from_text(&id.to_text()), Some(id));
        }
    }

    #[test]
    fn a_proc_status_of_any_text_parses_or_is_refused(text in "(Groups:|Name:|[0-9 \t\n]|x){0,40}") {
        let _ = Groups::from_proc_status(&text);
    }
}
