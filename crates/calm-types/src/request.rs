//! Request ids: which mutation of which client a request is, so a request sent again (its
//! client lost the answer when its server died) is answered as the first attempt was, without
//! applying anything twice.

/// How long after a grant of handles in advance a mount takes handles from it
/// (`Meta.GrantHandles`): a make answered with one reaches the server well within the hour a
/// server keeps a grant nobody used (the mount's outbox sends at once, and waits at most as
/// long as a commit in doubt is sent again, half an hour).
pub const GRANT_USED_FOR: std::time::Duration = std::time::Duration::from_secs(20 * 60);

/// Who sent a mutation, and which of its mutations it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestId {
    /// Chosen at random by the client when it starts.
    pub client: u64,
    /// The client's count of mutations, from 1.
    pub seq: u64,
    /// Every mutation of the client up to this one has been answered.
    pub acked: u64,
}

impl RequestId {
    /// `client:seq:acked` in hex, as the request metadata carries it.
    pub fn to_text(self) -> String {
        format!("{:x}:{:x}:{:x}", self.client, self.seq, self.acked)
    }

    /// Parses [`RequestId::to_text`]'s form; None for anything else, a sequence number of 0
    /// or an acknowledgement not below the sequence number.
    pub fn from_text(text: &str) -> Option<RequestId> {
        let mut parts = text.split(':').map(|p| u64::from_str_radix(p, 16).ok());
        let id = RequestId {
            client: parts.next()??,
            seq: parts.next()??,
            acked: parts.next()??,
        };
        (parts.next().is_none() && id.seq > 0 && id.acked < id.seq).then_some(id)
    }

    /// The id as a server keeps it for the client `identity` that sent it (the name the
    /// server knows its connection by): the client's id mixed with the identity's, so that a
    /// request sent under another identity never finds this one's record (nor leaves one this
    /// one would find), whoever learned the client's id. The same on every server and build:
    /// a request sent again to another server finds its record there.
    pub fn bound_to(self, identity: &str) -> RequestId {
        // FNV-1a of the identity, then a SplitMix64 finalizer: fixed functions, and a
        // bijection of the client's id for each identity.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in identity.bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut mix = hash.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix = (mix ^ (mix >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        mix = (mix ^ (mix >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        mix ^= mix >> 31;
        RequestId {
            client: self.client ^ mix,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_id_under_two_identities_is_two_clients() {
        let id = RequestId {
            client: 0x1234,
            seq: 7,
            acked: 6,
        };
        let mount = id.bound_to("cert:mount:host1");
        assert_eq!(mount, id.bound_to("cert:mount:host1"), "stable");
        assert_ne!(mount.client, id.bound_to("uid:1000").client);
        assert_ne!(mount.client, id.client);
        assert_eq!((mount.seq, mount.acked), (7, 6));
        // Fixed across builds and machines: a record written by one server is found by
        // another.
        assert_eq!(
            RequestId {
                client: 0,
                seq: 1,
                acked: 0
            }
            .bound_to("uid:0")
            .client,
            0x3790_ba3c_397a_c857
        );
    }
}
