//! Every decoder of the namespace's on-disk formats, given any bytes, answers with an error
//! (or nothing), never a panic: a damaged store is reported by fsck, not a crashed server.

use calm_meta::layout::{Dentry, Inode, NameHash, key_handle};
use calm_meta::place::describe;
use calm_meta::requests::{decode, written_ns};
use proptest::prelude::*;

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..160)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn an_inode_value_of_any_bytes_decodes_or_is_refused(handle in any::<u64>(), value in bytes()) {
        if let Ok(inode) = Inode::decode(handle, &value) {
            prop_assert_eq!(inode.handle, handle);
        }
    }

    #[test]
    fn an_entry_value_of_any_bytes_decodes_or_is_refused(value in bytes()) {
        let _ = Dentry::decode(&value);
        let _ = Dentry::decode_v7(&value);
    }

    #[test]
    fn keys_and_small_values_of_any_bytes_decode_or_are_refused(value in bytes()) {
        let _ = key_handle(&value);
        let _ = NameHash::from_value(&value);
        let _ = decode(&value);
        let _ = written_ns(&value);
        let _ = describe(&value);
    }
}
