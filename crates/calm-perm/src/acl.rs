//! POSIX access control lists by the rules of acl(5): their form as the `system.posix_acl_*`
//! extended attributes Linux exchanges, the access check, what chmod does to an access ACL,
//! and what a new file or directory takes from its directory's default ACL. Pure: an ACL, a
//! caller and an owner in, a decision out.
//!
//! The namespace keeps them and decides by them (calm-meta's `ops::acls`, [`crate::perm`]);
//! this module is the rule book.

use calm_types::Caller;
use calm_types::error::MetaError;

/// The xattr holding a file's access ACL.
pub const ACCESS_XATTR: &[u8] = b"system.posix_acl_access";
/// The xattr holding a directory's default ACL.
pub const DEFAULT_XATTR: &[u8] = b"system.posix_acl_default";

/// Which ACLs an inode has (calm-meta's `Inode::acls`): an access ACL
/// ([`ACCESS_XATTR`])...
pub const ACL_ACCESS: u8 = 1;
/// ... and a default ACL ([`DEFAULT_XATTR`], directories only).
pub const ACL_DEFAULT: u8 = 2;

/// Which ACL an xattr name is, if it is one.
pub fn acl_bit(name: &[u8]) -> Option<u8> {
    if name == ACCESS_XATTR {
        Some(ACL_ACCESS)
    } else if name == DEFAULT_XATTR {
        Some(ACL_DEFAULT)
    } else {
        None
    }
}

/// The xattr name of ACL `bit`.
pub fn acl_name(bit: u8) -> &'static [u8] {
    if bit == ACL_ACCESS {
        ACCESS_XATTR
    } else {
        DEFAULT_XATTR
    }
}

/// Entries an ACL may have (ext4 fits about 500 in a block; 1024 is generous).
pub const ACL_ENTRIES_MAX: usize = 1024;

const VERSION: u32 = 2;
const UNDEFINED_ID: u32 = u32::MAX;

/// Whom an entry is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tag {
    /// The file's owner.
    UserObj,
    /// A named user (uid).
    User(u32),
    /// The file's group.
    GroupObj,
    /// A named group (gid).
    Group(u32),
    /// The most any named user, the group and any named group get.
    Mask,
    /// Everyone else.
    Other,
}

impl Tag {
    fn code(self) -> (u16, u32) {
        match self {
            Tag::UserObj => (0x01, UNDEFINED_ID),
            Tag::User(uid) => (0x02, uid),
            Tag::GroupObj => (0x04, UNDEFINED_ID),
            Tag::Group(gid) => (0x08, gid),
            Tag::Mask => (0x10, UNDEFINED_ID),
            Tag::Other => (0x20, UNDEFINED_ID),
        }
    }

    fn from_code(tag: u16, id: u32) -> Option<Tag> {
        Some(match tag {
            0x01 => Tag::UserObj,
            0x02 => Tag::User(id),
            0x04 => Tag::GroupObj,
            0x08 => Tag::Group(id),
            0x10 => Tag::Mask,
            0x20 => Tag::Other,
            _ => return None,
        })
    }
}

/// One entry: whom, and which of read (4), write (2) and execute (1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: Tag,
    pub perm: u32,
}

/// A valid ACL: entries sorted by tag, one each of owner, group and other, a mask when there
/// is a named entry, no name twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

fn invalid(why: &str) -> MetaError {
    MetaError::Invalid(format!("ACL: {why}"))
}

impl Acl {
    /// Checks and sorts `entries`.
    pub fn new(mut entries: Vec<Entry>) -> Result<Acl, MetaError> {
        if entries.len() > ACL_ENTRIES_MAX {
            return Err(MetaError::NoSpace(format!(
                "an ACL of {} entries; at most {ACL_ENTRIES_MAX}",
                entries.len()
            )));
        }
        entries.sort_by_key(|e| e.tag);
        if entries.windows(2).any(|w| w[0].tag == w[1].tag) {
            return Err(invalid("an entry twice"));
        }
        if entries.iter().any(|e| e.perm & !0o7 != 0) {
            return Err(invalid("permissions other than read, write and execute"));
        }
        let has = |tag: Tag| entries.iter().any(|e| e.tag == tag);
        if !has(Tag::UserObj) || !has(Tag::GroupObj) || !has(Tag::Other) {
            return Err(invalid("no owner, group or other entry"));
        }
        let named = entries
            .iter()
            .any(|e| matches!(e.tag, Tag::User(_) | Tag::Group(_)));
        if named && !has(Tag::Mask) {
            return Err(invalid("named entries without a mask"));
        }
        Ok(Acl { entries })
    }

    /// The ACL equivalent to permission bits `mode`.
    pub fn from_mode(mode: u32) -> Acl {
        Acl {
            entries: vec![
                Entry {
                    tag: Tag::UserObj,
                    perm: (mode >> 6) & 0o7,
                },
                Entry {
                    tag: Tag::GroupObj,
                    perm: (mode >> 3) & 0o7,
                },
                Entry {
                    tag: Tag::Other,
                    perm: mode & 0o7,
                },
            ],
        }
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    fn perm(&self, tag: Tag) -> Option<u32> {
        self.entries.iter().find(|e| e.tag == tag).map(|e| e.perm)
    }

    fn set(&mut self, tag: Tag, perm: u32) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.tag == tag) {
            e.perm = perm;
        }
    }

    /// Decodes the xattr form: a version (2) and entries of tag, permissions and id (u16, u16,
    /// u32, little-endian).
    pub fn decode(value: &[u8]) -> Result<Acl, MetaError> {
        if value.len() < 4 || !(value.len() - 4).is_multiple_of(8) {
            return Err(invalid("not a whole header and entries"));
        }
        let version = u32::from_le_bytes(value[..4].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(invalid(&format!("version {version}, not {VERSION}")));
        }
        let mut entries = Vec::with_capacity((value.len() - 4) / 8);
        for raw in value[4..].chunks_exact(8) {
            let tag = u16::from_le_bytes([raw[0], raw[1]]);
            let perm = u16::from_le_bytes([raw[2], raw[3]]);
            let id = u32::from_le_bytes(raw[4..8].try_into().expect("4 bytes"));
            let tag = Tag::from_code(tag, id).ok_or_else(|| invalid(&format!("tag {tag:#x}")))?;
            entries.push(Entry {
                tag,
                perm: u32::from(perm),
            });
        }
        Acl::new(entries)
    }

    /// The xattr form, as Linux's `getxattr` gives it.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(4 + 8 * self.entries.len());
        v.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            let (tag, id) = e.tag.code();
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&(e.perm as u16).to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    /// The permission bits this ACL sets: owner, then the mask (or, without one, the group),
    /// then other.
    pub fn mode(&self) -> u32 {
        let group = self
            .perm(Tag::Mask)
            .or_else(|| self.perm(Tag::GroupObj))
            .unwrap_or(0);
        (self.perm(Tag::UserObj).unwrap_or(0) << 6)
            | (group << 3)
            | self.perm(Tag::Other).unwrap_or(0)
    }

    /// Whether the mode bits say all this ACL says (then no ACL is kept, only the mode).
    pub fn is_mode_only(&self) -> bool {
        self.entries.len() == 3
    }

    /// What chmod to `mode` makes of this access ACL: the owner, the mask (or the group) and
    /// other take the mode's bits; named entries stay, under the new mask.
    pub fn chmod(&self, mode: u32) -> Acl {
        let mut acl = self.clone();
        acl.set(Tag::UserObj, (mode >> 6) & 0o7);
        let group_tag = if acl.perm(Tag::Mask).is_some() {
            Tag::Mask
        } else {
            Tag::GroupObj
        };
        acl.set(group_tag, (mode >> 3) & 0o7);
        acl.set(Tag::Other, mode & 0o7);
        acl
    }

    /// acl(5)'s access check for a caller who is not the superuser: may it have `want` (read
    /// 4, write 2, execute 1) on a file owned by `uid`:`gid`?
    pub fn allows(&self, caller: &Caller, uid: u32, gid: u32, want: u32) -> bool {
        let mask = self.perm(Tag::Mask).unwrap_or(0o7);
        if caller.uid == uid {
            return self.perm(Tag::UserObj).unwrap_or(0) & want == want;
        }
        if let Some(perm) = self.perm(Tag::User(caller.uid)) {
            return perm & mask & want == want;
        }
        // The group entries that match the caller: access if one of them grants it all.
        let mut matched = false;
        for e in &self.entries {
            let matches = match e.tag {
                Tag::GroupObj => caller.in_group(gid),
                Tag::Group(g) => caller.in_group(g),
                _ => false,
            };
            if matches {
                matched = true;
                if e.perm & mask & want == want {
                    return true;
                }
            }
        }
        if matched {
            return false;
        }
        self.perm(Tag::Other).unwrap_or(0) & want == want
    }

    /// What a node made with `mode` (permission bits, before any umask) in a directory with
    /// this default ACL gets: its mode bits, its access ACL (none when the mode says it all),
    /// and, for a directory, this default ACL as its own. The umask does not apply: the
    /// default ACL stands in for it.
    pub fn inherit(&self, mode: u32, is_dir: bool) -> (u32, Option<Acl>, Option<Acl>) {
        let mut access = self.clone();
        let owner = access.perm(Tag::UserObj).unwrap_or(0) & (mode >> 6);
        access.set(Tag::UserObj, owner);
        let group_tag = if access.perm(Tag::Mask).is_some() {
            Tag::Mask
        } else {
            Tag::GroupObj
        };
        let group = access.perm(group_tag).unwrap_or(0) & (mode >> 3);
        access.set(group_tag, group);
        let other = access.perm(Tag::Other).unwrap_or(0) & mode;
        access.set(Tag::Other, other);
        let bits = (mode & !0o777) | access.mode();
        let access = (!access.is_mode_only()).then_some(access);
        (bits, access, is_dir.then(|| self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perm::{Owner, permission};
    use calm_types::attr::Kind;
    use proptest::prelude::*;

    fn caller(uid: u32, gid: u32, groups: Vec<u32>) -> Caller {
        Caller {
            session: 0,
            uid,
            gid,
            groups: calm_types::Groups::new(groups),
        }
    }

    fn entry(tag: Tag, perm: u32) -> Entry {
        Entry { tag, perm }
    }

    #[test]
    fn the_xattr_form_is_linuxs() {
        // What `setfacl -m u:1000:rw,m::rw` on a 0640 file leaves, as getxattr gives it.
        let acl = Acl::new(vec![
            entry(Tag::UserObj, 6),
            entry(Tag::User(1000), 6),
            entry(Tag::GroupObj, 4),
            entry(Tag::Mask, 6),
            entry(Tag::Other, 0),
        ])
        .unwrap();
        let bytes = acl.encode();
        assert_eq!(&bytes[..4], &[2, 0, 0, 0]);
        assert_eq!(&bytes[4..12], &[1, 0, 6, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(&bytes[12..20], &[2, 0, 6, 0, 0xe8, 0x03, 0, 0]);
        assert_eq!(Acl::decode(&bytes).unwrap(), acl);
        assert_eq!(acl.mode(), 0o660);
        assert!(Acl::decode(&bytes[..10]).is_err());
        let mut no_mask = acl.entries().to_vec();
        no_mask.retain(|e| e.tag != Tag::Mask);
        assert!(Acl::new(no_mask).is_err(), "a named entry needs a mask");
    }

    #[test]
    fn named_entries_are_held_under_the_mask_and_the_group_class_is_all_or_nothing() {
        let acl = Acl::new(vec![
            entry(Tag::UserObj, 7),
            entry(Tag::User(1000), 7),
            entry(Tag::GroupObj, 5),
            entry(Tag::Group(2000), 2),
            entry(Tag::Mask, 5),
            entry(Tag::Other, 4),
        ])
        .unwrap();
        let alice = caller(1000, 100, vec![]);
        assert!(acl.allows(&alice, 0, 0, 5));
        assert!(!acl.allows(&alice, 0, 0, 2), "write is masked");
        // In the owning group and in 2000: read from the group entry, not write from 2000's
        // (masked), and never other's as a fallback.
        let bob = caller(1001, 0, vec![2000]);
        assert!(acl.allows(&bob, 0, 0, 4));
        assert!(!acl.allows(&bob, 0, 0, 2));
        let carol = caller(1002, 2000, vec![]);
        assert!(
            !acl.allows(&carol, 0, 0, 4),
            "a matching group entry decides"
        );
        let dave = caller(1003, 3000, vec![]);
        assert!(acl.allows(&dave, 0, 0, 4) && !acl.allows(&dave, 0, 0, 1));
        // The owner gets the owner entry, unmasked.
        assert!(acl.allows(&caller(0, 0, vec![]), 0, 0, 7));
    }

    #[test]
    fn chmod_moves_the_mask_and_inheritance_masks_by_the_create_mode() {
        let default = Acl::new(vec![
            entry(Tag::UserObj, 7),
            entry(Tag::User(1000), 7),
            entry(Tag::GroupObj, 5),
            entry(Tag::Mask, 7),
            entry(Tag::Other, 5),
        ])
        .unwrap();
        // open(O_CREAT, 0666) under it: execute goes everywhere the mode lacks it.
        let (mode, access, own_default) = default.inherit(0o666, false);
        assert_eq!(
            mode, 0o664,
            "rw- from the owner, rw- from the mask, r-- from other"
        );
        let access = access.expect("named entries need an ACL");
        assert_eq!(access.perm(Tag::Mask), Some(6));
        assert_eq!(
            access.perm(Tag::User(1000)),
            Some(7),
            "named entries keep theirs"
        );
        assert!(own_default.is_none());
        // mkdir 0777: the default passes down whole.
        let (mode, _, own_default) = default.inherit(0o777, true);
        assert_eq!(mode, 0o775);
        assert_eq!(own_default, Some(default.clone()));
        // chmod 0640: the mask, not the group entry, takes the group bits.
        let changed = access.chmod(0o640);
        assert_eq!(changed.perm(Tag::Mask), Some(4));
        assert_eq!(changed.perm(Tag::GroupObj), Some(5));
        assert_eq!(changed.mode(), 0o640);
    }

    fn uid() -> impl Strategy<Value = u32> {
        0..4u32
    }

    proptest! {
        /// An ACL of the three base entries decides exactly as the mode bits it stands for.
        #[test]
        fn a_mode_only_acl_decides_as_the_mode(mode in 0..0o1000u32, cu in 1..4u32, cg in uid(),
                                                groups in prop::collection::vec(uid(), 0..3),
                                                fu in uid(), fg in uid(), want in 1..8u32) {
            let c = caller(cu, cg, groups);
            let acl = Acl::from_mode(mode);
            let owner = Owner::new(Kind::File, mode, fu, fg);
            prop_assert_eq!(acl.allows(&c, fu, fg, want), permission(&c, &owner, want).is_ok());
            prop_assert_eq!(acl.mode(), mode);
            prop_assert_eq!(acl.chmod(mode), acl.clone());
        }

        /// The xattr form round-trips; chmod then reading the mode gives the mode set.
        #[test]
        fn forms_round_trip(perms in prop::collection::vec(0..8u32, 6), users in prop::collection::btree_set(1..50u32, 0..4),
                            mode in 0..0o1000u32) {
            let mut entries = vec![entry(Tag::UserObj, perms[0]), entry(Tag::GroupObj, perms[1]),
                                   entry(Tag::Other, perms[2])];
            if !users.is_empty() {
                entries.push(entry(Tag::Mask, perms[3]));
            }
            for u in &users {
                entries.push(entry(Tag::User(*u), perms[4]));
                entries.push(entry(Tag::Group(*u), perms[5]));
            }
            let acl = Acl::new(entries).unwrap();
            prop_assert_eq!(Acl::decode(&acl.encode()).unwrap(), acl.clone());
            prop_assert_eq!(acl.chmod(mode).mode(), mode);
        }
    }
}
