//! The node agent's decoders of what the kernel and the disks give it, given any bytes or
//! text, answer with an error (or nothing), never a panic: a foreign disk label or an odd
//! uevent must not stop the agent.

use calm_node::label::{Label, MAGIC, parse_uuid};
use calm_node::mounts::kernel::{parse_events, parse_mountinfo};
use calm_node::uevent::parse;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn a_label_of_any_bytes_decodes_or_is_refused(mut bytes in prop::collection::vec(any::<u8>(), 0..300), magic in any::<bool>()) {
        if magic {
            // Behind the magic, so the decoder reads the fields that follow it.
            bytes.splice(0..bytes.len().min(8), MAGIC);
        }
        let _ = Label::decode(&bytes);
    }

    #[test]
    fn kernel_messages_of_any_bytes_parse_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = parse(&bytes);
        let _ = parse_events(&bytes);
    }

    #[test]
    fn a_mount_table_or_a_uuid_of_any_text_parses_or_is_refused(text in "[ -~\n\t]{0,200}") {
        let _ = parse_mountinfo(&text);
        let _ = parse_uuid(&text);
    }
}
