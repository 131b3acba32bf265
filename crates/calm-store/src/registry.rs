//! The registry of the servers that share a store (a shared engine such as etcd): who is a
//! member, under a lease; which view of the members each one acknowledged; which client lock
//! sessions each one opened; and the storage nodes' target registrations, which every server
//! lists. The lock service decides from it which server decides a file's
//! locks (`calm-locks::cluster`). A store that only one process writes has none.
//!
//! Keys are the backend's business; the calls are synchronous and bounded in time, so that a
//! server that cannot reach the registry finds out within its lease.

/// The members of the registry at one moment, and the view each one acknowledged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    /// `(server id, address clients reach it at)`, by id.
    pub servers: Vec<(u64, String)>,
    /// `(server id, the member ids of the view it acknowledged)`.
    pub acks: Vec<(u64, Vec<u64>)>,
}

/// Most members a registry lists: more servers than any cluster of calm has.
pub const MEMBERS_MAX: usize = 1024;

pub trait Registry: Send + Sync + std::fmt::Debug {
    /// Registers this server as `id`, reachable at `address`, under a new lease of about
    /// `lease_ms` (the backend may round it up); its sessions are kept under a second lease of
    /// about `holders_ms`, renewed with the first, so that they outlive the server by that
    /// much. Returns the lease granted, in milliseconds.
    fn join(&self, id: u64, address: &str, lease_ms: u64, holders_ms: u64) -> crate::Result<u64>;
    /// Renews both leases. `Ok(false)`: one ran out, and the membership with it (join again,
    /// then record the open sessions again).
    fn renew(&self) -> crate::Result<bool>;
    /// The members and their acknowledgements (a linearizable read).
    fn members(&self) -> crate::Result<Members>;
    /// Records that this server decides by `view` (kept under its lease).
    fn ack(&self, view: &[u64]) -> crate::Result<()>;
    /// Records that this server opened the client lock session `session` for the client
    /// identity `owner` (which alone may reclaim through it), under the holders'
    /// lease (kept `holders_ms` after the server's last renewal, so that the servers taking
    /// its files over find the session and wait for its reclaim; then gone). Waits for the
    /// server to have joined, within the backend's bound for one call.
    fn hold(&self, session: u64, owner: &str) -> crate::Result<()>;
    /// Forgets `session` (it was closed or expired).
    fn unhold(&self, session: u64) -> crate::Result<()>;
    /// Every session recorded by [`Registry::hold`], with its owner.
    fn holders(&self) -> crate::Result<Vec<(u64, String)>>;
    /// Records what storage node `node` registered (the target registry's soft state, kept
    /// under this server's lease: when the server dies, the node registers again elsewhere).
    fn put_node(&self, node: &str, value: &[u8]) -> crate::Result<()>;
    /// What `node` registered, if anything.
    fn node(&self, node: &str) -> crate::Result<Option<Vec<u8>>>;
    /// What every node registered.
    fn nodes(&self) -> crate::Result<Vec<Vec<u8>>>;
    /// A channel that receives a message after a change of the members or acknowledgements
    /// (coalesced).
    fn watch(&self) -> crate::Result<std::sync::mpsc::Receiver<()>>;
    /// Leaves: revokes the lease, so that the others take the files over at once.
    fn leave(&self) -> crate::Result<()>;
}
