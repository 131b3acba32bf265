//! Who a request acts for. The connection's [`Peer`] (decided when it was accepted) makes an
//! [`Identity`]; the identity decides which uid, gid and groups the request's operations are
//! checked with ([`Auth::caller`]) and which services it may use.
//!
//! - **Admin**: the server's own process (an embedded mount), the superuser of this machine
//!   (on the Unix socket or on loopback), an `admin` certificate. Acts for any uid it names,
//!   and may administer (changelog readers, targets, others' lock sessions).
//! - **Mount**: a `mount:NAME` certificate. Acts for the uids of its kernel's callers, as an
//!   NFS client host does; with `--root-squash` its uid 0 acts as nobody (65534).
//! - **User**: any other local process (the kernel's SO_PEERCRED) or a `user:UID[:GID]`
//!   certificate. Acts as that uid and nothing else, whatever a request claims; no data-plane
//!   calls (it cannot reach the object store anyway), no administration. With `--root-squash`
//!   a `user:0` certificate acts as nobody.
//!
//! A request with no identity (no peer: it did not come through a listener, nor from this
//! process) is refused. A request that names a lock session (`calm-session`) another identity
//! opened is refused too: the session goes into the changelog record and owns the orphans of
//! the mutation, and a mount skips its own session's records when it keeps its cache exact.

use calm_types::sync::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use calm_meta::{Caller, Groups};
use calm_proto::changelog::{GID_KEY, GROUPS_KEY, SESSION_KEY, UID_KEY};
use tonic::{Request, Status};

use crate::listen::Peer;

/// The uid and gid a squashed superuser acts as.
pub const NOBODY: u32 = 65_534;

/// What a client is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    Admin {
        key: String,
    },
    Mount {
        key: String,
        squash: bool,
    },
    User {
        key: String,
        uid: u32,
        gid: u32,
        groups: Groups,
    },
}

impl Identity {
    /// Names the client, for what belongs to it (lock sessions).
    pub fn key(&self) -> &str {
        match self {
            Identity::Admin { key } | Identity::Mount { key, .. } | Identity::User { key, .. } => {
                key
            }
        }
    }

    pub fn is_admin(&self) -> bool {
        matches!(self, Identity::Admin { .. })
    }

    /// May act for other uids (an administrator or a mount).
    pub fn is_trusted(&self) -> bool {
        !matches!(self, Identity::User { .. })
    }
}

/// How the server turns peers into identities.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    /// Certificates of mounts have their uid 0 act as nobody.
    pub root_squash: bool,
    /// Which identity opened each lock session (shared by every service of one server).
    pub sessions: Arc<SessionOwners>,
}

/// Lock session → the identity that opened it ([`Identity::key`]): a session id alone grants
/// nothing; only its owner (or an administrator) names it.
#[derive(Debug, Default)]
pub struct SessionOwners {
    owners: Mutex<HashMap<u64, String>>,
    /// Sessions being opened, per user identity (see [`SessionOwners::reserve`]).
    opening: Mutex<HashMap<String, usize>>,
}

/// Session owners remembered before ended sessions are forgotten.
pub const SESSION_OWNERS_MAX: usize = 4096;

/// Lock sessions one user identity (a local user, a `user:` certificate) may have open at
/// once; mounts and administrators are not counted (a mount's users lock through the mount's
/// own session).
pub const SESSIONS_PER_USER_MAX: usize = 16;

/// Locks one session of a user identity may hold (a mount's or an administrator's: the lock
/// manager's own limit, `calm_locks::Limits::locks_per_session_max`). With
/// [`SESSIONS_PER_USER_MAX`], one user holds at most 262 144 locks: about 18 MiB of the
/// server's memory at 68 bytes a lock.
pub const LOCKS_PER_USER_SESSION_MAX: u64 = 16_384;

/// Files one session of a user identity may keep open after their last name went (orphans:
/// each keeps its inode and contents until released): a mount's are the files its processes
/// hold open, bounded by the kernel; a user talking to the server directly is bounded here.
pub const ORPHANS_PER_USER_SESSION_MAX: usize = 1024;

/// A session of a user identity being opened: counted against [`SESSIONS_PER_USER_MAX`]
/// until dropped (by then the session is in the owners, or was not opened).
#[derive(Debug)]
pub struct Reservation<'a> {
    owners: &'a SessionOwners,
    key: Option<String>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some(key) = &self.key {
            let mut opening = self.owners.opening.locked();
            if let Some(count) = opening.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    opening.remove(key);
                }
            }
        }
    }
}

impl SessionOwners {
    /// Room for one more session of `identity`: always for a mount or an administrator; for a
    /// user, unless it has [`SESSIONS_PER_USER_MAX`] open or being opened (the ones `live`
    /// says have ended are forgotten first). Err: the limit.
    pub fn reserve(
        &self,
        identity: &Identity,
        live: impl Fn(u64) -> bool,
    ) -> Result<Reservation<'_>, usize> {
        if identity.is_trusted() {
            return Ok(Reservation {
                owners: self,
                key: None,
            });
        }
        let key = identity.key();
        let mut owners = self.owners.locked();
        let mut opening = self.opening.locked();
        let pending = opening.get(key).copied().unwrap_or(0);
        let mut open = owners.values().filter(|k| *k == key).count();
        if open + pending >= SESSIONS_PER_USER_MAX {
            owners.retain(|s, k| k != key || live(*s));
            open = owners.values().filter(|k| *k == key).count();
        }
        if open + pending >= SESSIONS_PER_USER_MAX {
            return Err(SESSIONS_PER_USER_MAX);
        }
        *opening.entry(key.to_string()).or_default() += 1;
        Ok(Reservation {
            owners: self,
            key: Some(key.to_string()),
        })
    }

    /// Notes that `key` opened `session`; past [`SESSION_OWNERS_MAX`], first forgets the
    /// sessions `live` says have ended.
    pub fn opened(&self, session: u64, key: &str, live: impl Fn(u64) -> bool) {
        let mut owners = self.owners.locked();
        if owners.len() >= SESSION_OWNERS_MAX {
            owners.retain(|s, _| live(*s));
        }
        owners.insert(session, key.to_string());
    }

    /// Each identity that opened sessions, with the sessions it opened, in order of keys.
    pub fn by_owner(&self) -> Vec<(String, Vec<u64>)> {
        let mut by: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
        for (session, key) in self.owners.locked().iter() {
            by.entry(key.clone()).or_default().push(*session);
        }
        by.into_iter().collect()
    }

    /// Who opened `session`, if it is known here.
    pub fn owner(&self, session: u64) -> Option<String> {
        self.owners.locked().get(&session).cloned()
    }

    pub fn closed(&self, session: u64) {
        self.owners.locked().remove(&session);
    }

    /// Whether `identity` may name `session`: it opened it, it administers, or the session
    /// is unknown here (ended, or opened before a restart: its user finds out from the lock
    /// manager, and it owns nothing any more).
    pub fn may_use(&self, session: u64, identity: &Identity) -> bool {
        if session == 0 || identity.is_admin() {
            return true;
        }
        match self.owners.locked().get(&session) {
            Some(owner) => owner == identity.key(),
            None => true,
        }
    }
}

fn unauthenticated(why: &str) -> Status {
    Status::unauthenticated(why.to_string())
}

fn denied(what: &str) -> Status {
    Status::permission_denied(what.to_string())
}

impl Auth {
    /// The identity `request` acts with.
    pub fn identity<T>(&self, request: &Request<T>) -> Result<Identity, Status> {
        if request
            .extensions()
            .get::<calm_proto::InProcess>()
            .is_some()
        {
            return Ok(Identity::Admin {
                key: "in-process".into(),
            });
        }
        let Some(peer) = request.extensions().get::<Peer>() else {
            return Err(unauthenticated("the request came through no listener"));
        };
        Ok(match peer {
            Peer::Local { uid: 0, .. } | Peer::LoopbackRoot => Identity::Admin {
                key: "uid:0".into(),
            },
            Peer::Local {
                uid, gid, groups, ..
            } => Identity::User {
                key: format!("uid:{uid}"),
                uid: *uid,
                gid: *gid,
                groups: groups.clone(),
            },
            Peer::Certificate { name } => self.certificate(name)?,
            Peer::Refused { why, .. } => return Err(unauthenticated(why)),
        })
    }

    /// Whether `name` is one a client certificate may carry (what `calm certs` checks
    /// before it issues one).
    pub fn check_client_name(name: &str) -> Result<(), String> {
        Auth::default()
            .certificate(name)
            .map(|_| ())
            .map_err(|status| status.message().to_string())
    }

    fn certificate(&self, name: &str) -> Result<Identity, Status> {
        let key = format!("cert:{name}");
        if name == "admin" {
            return Ok(Identity::Admin { key });
        }
        if let Some(mount) = name.strip_prefix("mount:")
            && !mount.is_empty()
        {
            return Ok(Identity::Mount {
                key,
                squash: self.root_squash,
            });
        }
        if let Some(ids) = name.strip_prefix("user:") {
            let mut parts = ids.split(':').map(str::parse::<u32>);
            let uid = parts.next().and_then(Result::ok);
            let gid = parts.next().transpose().ok().flatten();
            if let Some(uid) = uid
                && parts.next().is_none()
            {
                let gid = gid.unwrap_or(uid);
                // With root squash no certificate acts as the superuser: a `user:0` one is
                // nobody, as a mount's uid 0 is.
                let (uid, gid) = match self.root_squash && uid == 0 {
                    true => (NOBODY, NOBODY),
                    false => (uid, gid),
                };
                return Ok(Identity::User {
                    key,
                    uid,
                    gid,
                    groups: Groups::default(),
                });
            }
        }
        Err(unauthenticated(&format!(
            "certificate name {name:?}: expected admin, mount:NAME or user:UID[:GID]"
        )))
    }

    /// Who `request`'s operations are checked as: what it names (session, uid, gid, groups)
    /// for an administrator or a mount (a mount's uid 0 squashed if so configured); the
    /// user itself for a user, with the session it names.
    pub fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let claimed = claimed(request)?;
        let identity = self.identity(request)?;
        if !self.sessions.may_use(claimed.session, &identity) {
            return Err(denied(&format!(
                "lock session {} belongs to another client",
                claimed.session
            )));
        }
        Ok(match identity {
            Identity::Admin { .. } => claimed,
            Identity::Mount { squash, .. } => {
                if squash && claimed.uid == 0 {
                    Caller {
                        session: claimed.session,
                        uid: NOBODY,
                        gid: NOBODY,
                        groups: Groups::default(),
                    }
                } else {
                    claimed
                }
            }
            Identity::User {
                uid, gid, groups, ..
            } => Caller {
                session: claimed.session,
                uid,
                gid,
                groups,
            },
        })
    }

    /// Whether every operation of `request`'s client is checked as the very caller it names
    /// (an administrator, or a mount whose root is not squashed): then the kernel under that
    /// client, checking its callers against the attributes it was given, decides as the server
    /// would, and a mount may answer an open from a copy (`crate::holds`).
    pub fn acts_as_named<T>(&self, request: &Request<T>) -> bool {
        matches!(
            self.identity(request),
            Ok(Identity::Admin { .. } | Identity::Mount { squash: false, .. })
        )
    }

    /// An administrator's request, else PERMISSION_DENIED naming `what`.
    pub fn admin<T>(&self, request: &Request<T>, what: &str) -> Result<Identity, Status> {
        let identity = self.identity(request)?;
        if identity.is_admin() {
            Ok(identity)
        } else {
            Err(denied(&format!("{what} needs an administrator")))
        }
    }

    /// A mount's or an administrator's request, else PERMISSION_DENIED naming `what`.
    pub fn trusted<T>(&self, request: &Request<T>, what: &str) -> Result<Identity, Status> {
        let identity = self.identity(request)?;
        if identity.is_trusted() {
            Ok(identity)
        } else {
            Err(denied(&format!("{what} is for mounts and administrators")))
        }
    }
}

/// What a request names as its caller (`calm-session`, `calm-uid`, `calm-gid`,
/// `calm-groups`); absent entries count as 0 (no groups). More than
/// [`calm_meta::perm::GROUPS_MAX`] groups, or one that is not a number, is refused.
/// The caller `request` says it acts for (before the identity's rules map it).
pub(crate) fn claimed<T>(request: &Request<T>) -> Result<Caller, Status> {
    fn get<N: std::str::FromStr + Default>(
        metadata: &tonic::metadata::MetadataMap,
        key: &str,
    ) -> Result<N, Status> {
        match metadata.get(key) {
            None => Ok(N::default()),
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| Status::invalid_argument(format!("{key}: not a number"))),
        }
    }
    let m = request.metadata();
    let groups = match m.get(GROUPS_KEY) {
        None => Vec::new(),
        Some(v) => {
            let text = v
                .to_str()
                .map_err(|_| Status::invalid_argument(format!("{GROUPS_KEY}: not text")))?;
            let groups: Result<Vec<u32>, _> = text.split(',').map(str::parse).collect();
            let groups = groups.map_err(|_| {
                Status::invalid_argument(format!("{GROUPS_KEY}: not a list of numbers"))
            })?;
            if groups.len() > calm_meta::perm::GROUPS_MAX {
                return Err(Status::invalid_argument(format!(
                    "{} groups: at most {}",
                    groups.len(),
                    calm_meta::perm::GROUPS_MAX
                )));
            }
            groups
        }
    };
    Ok(Caller {
        session: get(m, SESSION_KEY)?,
        uid: get(m, UID_KEY)?,
        gid: get(m, GID_KEY)?,
        groups: Groups::new(groups),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(peer: Peer, uid: u32) -> Request<()> {
        let mut r = Request::new(());
        r.extensions_mut().insert(peer);
        r.metadata_mut()
            .insert(UID_KEY, uid.to_string().parse().unwrap());
        r.metadata_mut().insert(GID_KEY, "0".parse().unwrap());
        r.metadata_mut().insert(GROUPS_KEY, "0,4".parse().unwrap());
        r
    }

    #[test]
    fn a_user_acts_as_itself_whatever_it_claims() {
        let auth = Auth::default();
        let peer = Peer::Local {
            uid: 1000,
            gid: 100,
            pid: 1,
            groups: Groups::new(vec![27]),
        };
        let caller = auth.caller(&from(peer.clone(), 0)).unwrap();
        assert_eq!((caller.uid, caller.gid), (1000, 100));
        assert_eq!(caller.groups.as_slice(), &[27]);
        assert!(auth.admin(&from(peer.clone(), 0), "x").is_err());
        assert!(auth.trusted(&from(peer, 0), "x").is_err());
    }

    #[test]
    fn root_and_mounts_act_for_their_callers_and_squash_applies_to_mounts() {
        let auth = Auth {
            root_squash: true,
            ..Auth::default()
        };
        let root = auth.caller(&from(Peer::LoopbackRoot, 0)).unwrap();
        assert_eq!(root.uid, 0, "root on this machine is not squashed");
        let mount = Peer::Certificate {
            name: "mount:host1".into(),
        };
        assert_eq!(auth.caller(&from(mount.clone(), 1000)).unwrap().uid, 1000);
        let squashed = auth.caller(&from(mount.clone(), 0)).unwrap();
        assert_eq!((squashed.uid, squashed.gid), (NOBODY, NOBODY));
        assert!(squashed.groups.as_slice().is_empty());
        assert!(auth.trusted(&from(mount.clone(), 0), "x").is_ok());
        assert!(auth.admin(&from(mount, 0), "x").is_err());
        // A user certificate for uid 0 is squashed too, whatever it claims.
        for name in ["user:0", "user:0:0"] {
            let cert = Peer::Certificate { name: name.into() };
            let squashed = auth.caller(&from(cert.clone(), 0)).unwrap();
            assert_eq!((squashed.uid, squashed.gid), (NOBODY, NOBODY), "{name}");
            let unsquashed = Auth::default().caller(&from(cert, 0)).unwrap();
            assert_eq!(unsquashed.uid, 0, "{name} without root squash");
        }
    }

    #[test]
    fn certificate_names() {
        let auth = Auth::default();
        let cert = |name: &str| {
            auth.identity(&from(
                Peer::Certificate {
                    name: name.to_string(),
                },
                0,
            ))
        };
        assert!(cert("admin").unwrap().is_admin());
        assert!(matches!(
            cert("user:1000:100").unwrap(),
            Identity::User {
                uid: 1000,
                gid: 100,
                ..
            }
        ));
        assert!(matches!(
            cert("user:7").unwrap(),
            Identity::User { uid: 7, gid: 7, .. }
        ));
        for bad in ["root", "mount:", "user:x", "user:1:2:3", ""] {
            assert!(cert(bad).is_err(), "{bad}");
        }
        let nobody = Request::new(());
        assert_eq!(
            auth.identity(&nobody).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
    }
}
