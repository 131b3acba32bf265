//! Request ids: which mutation of which client a request is, so a request sent again (its
//! client lost the answer when its server died) is answered as the first attempt was, without
//! applying anything twice.

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
}
