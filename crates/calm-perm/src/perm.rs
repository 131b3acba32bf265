//! Linux's permission rules, applied by the server to every operation for the caller it
//! authenticated (as ext4 and tmpfs apply them in the kernel): owner, group and other bits
//! with supplementary groups, or the file's access ACL when it has one ([`crate::acl`]); the superuser (uid 0) passes every check but executing a file
//! nobody may execute; sticky directories; a setgid directory's group inherited by what is
//! made in it; setuid and setgid cleared by writes, truncates and owner changes; who may chmod,
//! chown and set times; the xattr namespaces. Pure: attributes and a caller in, a decision out.
//!
//! Root squash and trusted mounts are decided before a [`Caller`] exists: here uid 0 is the
//! superuser, whoever it is.

use calm_types::Caller;
use calm_types::attr::{Kind, SetAttr, SetTime};
use calm_types::error::MetaError;

pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;
pub const S_ISVTX: u32 = 0o1000;
const S_IXGRP: u32 = 0o010;

/// Access wanted, as `access(2)`'s bits.
pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXEC: u32 = 1;

pub use calm_types::GROUPS_MAX;

/// Whether the checks run. Only the benchmark that measures what they cost turns them off,
/// and only in a build with the `checks-off-for-benchmark` feature (off by default: the
/// `calm` binary never has it, so nothing a site runs can turn a check off).
#[cfg(feature = "checks-off-for-benchmark")]
static CHECKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns the permission checks off (or on again) in this process: for the benchmark that
/// measures their cost, never for serving. Off, [`permission`] and [`may_delete`] allow
/// everything (what the namespace did before it checked: the inodes a check reads were read
/// anyway, a lookup's directory for ENOTDIR); ownership rules (`new_owner`, `setattr`)
/// still apply.
#[cfg(feature = "checks-off-for-benchmark")]
pub fn set_checks_for_benchmark(on: bool) {
    CHECKS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the checks run: always, unless a benchmark build turned them off.
#[cfg(feature = "checks-off-for-benchmark")]
pub fn checks() -> bool {
    CHECKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether the checks run: always (this build cannot turn them off).
#[cfg(not(feature = "checks-off-for-benchmark"))]
pub const fn checks() -> bool {
    true
}

/// What a permission decision looks at of an inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub kind: Kind,
    /// Permission bits with setuid, setgid and sticky (`0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Its access ACL: where it has one, the ACL decides rather than the mode bits.
    pub acl: Option<std::sync::Arc<crate::acl::Acl>>,
}

impl Owner {
    /// An inode without an ACL.
    pub fn new(kind: Kind, mode: u32, uid: u32, gid: u32) -> Owner {
        Owner {
            kind,
            mode,
            uid,
            gid,
            acl: None,
        }
    }
}

/// Whether the caller owns the inode.
fn owns(caller: &Caller, inode: &Owner) -> bool {
    caller.uid == inode.uid
}

fn denied(what: &str) -> MetaError {
    MetaError::Access(what.to_string())
}

fn not_permitted(what: &str) -> MetaError {
    MetaError::NotPermitted(what.to_string())
}

/// `generic_permission`: may the caller have `mask` (MAY_READ | MAY_WRITE | MAY_EXEC) on
/// `inode`? The owner class, else the group class (the file's group or a supplementary one),
/// else other, whichever applies first, even if a later class would allow more.
pub fn permission(caller: &Caller, inode: &Owner, mask: u32) -> Result<(), MetaError> {
    if !checks() {
        return Ok(());
    }
    if caller.is_root() {
        // Read and write always; execute only where someone may (search on directories).
        if mask & MAY_EXEC == 0 || inode.kind == Kind::Dir || inode.mode & 0o111 != 0 {
            return Ok(());
        }
        return Err(denied("no one may execute this file"));
    }
    if let Some(acl) = &inode.acl
        && !owns(caller, inode)
    {
        return if acl.allows(caller, inode.uid, inode.gid, mask) {
            Ok(())
        } else {
            Err(denied("access ACL"))
        };
    }
    let bits = if owns(caller, inode) {
        inode.mode >> 6
    } else if caller.in_group(inode.gid) {
        inode.mode >> 3
    } else {
        inode.mode
    } & 0o7;
    if bits & mask == mask {
        Ok(())
    } else {
        Err(denied("permission bits"))
    }
}

/// Search permission on a directory, for a lookup in it.
pub fn may_lookup(caller: &Caller, dir: &Owner) -> Result<(), MetaError> {
    permission(caller, dir, MAY_EXEC)
}

/// Making or removing a name in `dir`: write and search permission on it.
pub fn may_change_dir(caller: &Caller, dir: &Owner) -> Result<(), MetaError> {
    permission(caller, dir, MAY_WRITE | MAY_EXEC)
}

/// Removing (or renaming away, or replacing) `victim`'s name in `dir`: write and search on
/// `dir`, and in a sticky directory only the owner of the victim or of the directory, or the
/// superuser.
pub fn may_delete(caller: &Caller, dir: &Owner, victim: &Owner) -> Result<(), MetaError> {
    may_change_dir(caller, dir)?;
    if dir.mode & S_ISVTX != 0
        && checks()
        && !caller.is_root()
        && !owns(caller, dir)
        && !owns(caller, victim)
    {
        return Err(not_permitted(
            "a sticky directory: only the owner removes a name",
        ));
    }
    Ok(())
}

/// A hard link to `target` (`fs.protected_hardlinks`, on by default): someone other than its
/// owner (or the superuser) may link only a regular file, not setuid, not setgid-executable,
/// that they may read and write.
pub fn may_link(caller: &Caller, target: &Owner) -> Result<(), MetaError> {
    if caller.is_root() || owns(caller, target) {
        return Ok(());
    }
    let safe = target.kind == Kind::File
        && target.mode & S_ISUID == 0
        && target.mode & (S_ISGID | S_IXGRP) != (S_ISGID | S_IXGRP)
        && permission(caller, target, MAY_READ | MAY_WRITE).is_ok();
    if safe {
        Ok(())
    } else {
        Err(not_permitted("a hard link to someone else's file"))
    }
}

/// Owner, group and mode of a node the caller makes in `dir`, asked for as `uid`, `gid` and
/// `mode` (the superuser's request is taken as it is; anyone else's node is theirs): a setgid
/// directory gives its group, and its setgid bit to new directories; a new file keeps its
/// setgid-executable bits only for a member of its group.
pub fn new_owner(
    caller: &Caller,
    dir: &Owner,
    kind: Kind,
    uid: u32,
    gid: u32,
    mode: u32,
) -> (u32, u32, u32) {
    let uid = if caller.is_root() { uid } else { caller.uid };
    let mut gid = if caller.is_root() { gid } else { caller.gid };
    let mut mode = mode;
    if dir.mode & S_ISGID != 0 {
        gid = dir.gid;
        if kind == Kind::Dir {
            mode |= S_ISGID;
        }
    }
    if kind != Kind::Dir
        && mode & (S_ISGID | S_IXGRP) == (S_ISGID | S_IXGRP)
        && !caller.is_root()
        && !caller.in_group(gid)
    {
        mode &= !S_ISGID;
    }
    (uid, gid, mode)
}

/// Making a node of `kind`: a character or block device is the superuser's alone (Linux asks
/// for CAP_MKNOD); FIFOs and sockets, like files, only need the directory's permission.
pub fn may_make(caller: &Caller, kind: Kind) -> Result<(), MetaError> {
    match kind {
        Kind::CharDevice | Kind::BlockDevice if !caller.is_root() => {
            Err(not_permitted("only the superuser makes devices"))
        }
        _ => Ok(()),
    }
}

/// The mode after a write or truncate by the caller of a file of group `gid`: setuid goes,
/// and setgid where it means set-group-id on execution (group execute set) or the caller is
/// not in the file's group, unless the caller is the superuser (as Linux decides it).
pub fn after_write(caller: &Caller, kind: Kind, mode: u32, gid: u32) -> u32 {
    if caller.is_root() || kind == Kind::Dir {
        mode
    } else {
        calm_types::attr::mode_after_unprivileged_write(mode, caller.in_group(gid))
    }
}

fn kill_priv(mode: u32) -> u32 {
    let mut mode = mode & !S_ISUID;
    if mode & S_IXGRP != 0 {
        mode &= !S_ISGID;
    }
    mode
}

/// Writing contents (records, appends, a truncate through an open file). The owner may,
/// whatever the bits, as NFS servers allow: a process that opened its file for writing keeps
/// writing after a chmod, and the server cannot see the open.
pub fn may_write_contents(caller: &Caller, inode: &Owner) -> Result<(), MetaError> {
    if owns(caller, inode) {
        return Ok(());
    }
    permission(caller, inode, MAY_WRITE)
}

/// Reading contents: read permission, with the owner override of [`may_write_contents`].
pub fn may_read_contents(caller: &Caller, inode: &Owner) -> Result<(), MetaError> {
    if owns(caller, inode) {
        return Ok(());
    }
    permission(caller, inode, MAY_READ)
}

/// Checks a setattr against `setattr_prepare`'s rules and returns the mode to store (the
/// requested one, or the current one, with the setuid and setgid bits a non-superuser's chmod,
/// a chown or a truncate takes away).
pub fn setattr(caller: &Caller, inode: &Owner, change: &SetAttr) -> Result<u32, MetaError> {
    let root = caller.is_root();
    let owner = owns(caller, inode);
    let new_uid = change.uid.unwrap_or(inode.uid);
    let new_gid = change.gid.unwrap_or(inode.gid);
    if new_uid != inode.uid && !root {
        return Err(not_permitted("only the superuser gives a file away"));
    }
    if change.uid.is_some() && !root && !owner {
        return Err(not_permitted("chown of someone else's file"));
    }
    if change.gid.is_some()
        && !root
        && (!owner || (new_gid != inode.gid && !caller.in_group(new_gid)))
    {
        return Err(not_permitted("chgrp to a group the caller is not in"));
    }
    let mut mode = inode.mode;
    if let Some(requested) = change.mode {
        if !root && !owner {
            return Err(not_permitted("chmod of someone else's file"));
        }
        mode = requested;
        if !root && !caller.in_group(new_gid) {
            mode &= !S_ISGID;
        }
    }
    let explicit = |t: Option<SetTime>| matches!(t, Some(SetTime::At(_)));
    if explicit(change.atime) || explicit(change.mtime) {
        if !root && !owner {
            return Err(not_permitted("setting times of someone else's file"));
        }
    } else if (change.atime.is_some() || change.mtime.is_some()) && !root && !owner {
        permission(caller, inode, MAY_WRITE)?;
    }
    if change.size.is_some() {
        may_write_contents(caller, inode)?;
    }
    let chowned = new_uid != inode.uid || new_gid != inode.gid;
    if inode.kind != Kind::Dir && change.mode.is_none() {
        if chowned {
            mode = kill_priv(mode);
        } else if change.size.is_some() {
            mode = after_write(caller, inode.kind, mode, inode.gid);
        }
    }
    Ok(mode)
}

/// The namespace of an xattr name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Space {
    User,
    Trusted,
    Security,
    /// `system.posix_acl_access` and `system.posix_acl_default`.
    Acl,
}

fn space(name: &[u8]) -> Result<Space, MetaError> {
    if name.starts_with(b"user.") {
        Ok(Space::User)
    } else if name.starts_with(b"trusted.") {
        Ok(Space::Trusted)
    } else if name.starts_with(b"security.") {
        Ok(Space::Security)
    } else if name == crate::acl::ACCESS_XATTR || name == crate::acl::DEFAULT_XATTR {
        Ok(Space::Acl)
    } else {
        Err(MetaError::NotSupported(format!(
            "xattr namespace of {:?}: only user., trusted., security. and the POSIX ACLs",
            String::from_utf8_lossy(name)
        )))
    }
}

/// Setting or removing an ACL of `inode`: its owner or the superuser; none on a symlink.
pub fn may_set_acl(caller: &Caller, inode: &Owner) -> Result<(), MetaError> {
    if inode.kind == Kind::Symlink {
        return Err(MetaError::NotSupported("ACLs on a symlink".into()));
    }
    if caller.is_root() || owns(caller, inode) {
        Ok(())
    } else {
        Err(not_permitted("the ACL of someone else's file"))
    }
}

/// Setting or removing the xattr `name` of `inode`: `user.*` by write permission, on regular
/// files and directories only (and on a sticky directory by its owner only); `trusted.*` and
/// `security.*` by the superuser; ACLs by [`may_set_acl`]; other namespaces are not
/// supported.
pub fn may_set_xattr(caller: &Caller, inode: &Owner, name: &[u8]) -> Result<(), MetaError> {
    match space(name)? {
        Space::Acl => may_set_acl(caller, inode),
        Space::Trusted | Space::Security if !caller.is_root() => Err(not_permitted(
            "trusted. and security. xattrs are the superuser's",
        )),
        Space::Trusted | Space::Security => Ok(()),
        Space::User => {
            if !matches!(inode.kind, Kind::File | Kind::Dir) {
                return Err(not_permitted("user. xattrs on a special file"));
            }
            if inode.kind == Kind::Dir
                && inode.mode & S_ISVTX != 0
                && !caller.is_root()
                && !owns(caller, inode)
            {
                return Err(not_permitted(
                    "user. xattrs of someone else's sticky directory",
                ));
            }
            permission(caller, inode, MAY_WRITE)
        }
    }
}

/// Reading the xattr `name` of `inode`: `user.*` by read permission (none on special files:
/// ENODATA); `trusted.*` only for the superuser (ENODATA for others, as if absent);
/// `security.*` and ACLs by anyone.
pub fn may_get_xattr(caller: &Caller, inode: &Owner, name: &[u8]) -> Result<(), MetaError> {
    match space(name)? {
        Space::Trusted if !caller.is_root() => Err(MetaError::NoData),
        Space::Trusted | Space::Security | Space::Acl => Ok(()),
        Space::User => {
            if !matches!(inode.kind, Kind::File | Kind::Dir) {
                return Err(MetaError::NoData);
            }
            permission(caller, inode, MAY_READ)
        }
    }
}

/// Whether the caller sees the xattr `name` in a listing (`trusted.*` only the superuser).
pub fn lists_xattr(caller: &Caller, name: &[u8]) -> bool {
    caller.is_root() || !name.starts_with(b"trusted.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use calm_types::Groups;

    fn who(uid: u32, gid: u32, groups: &[u32]) -> Caller {
        Caller {
            session: 0,
            uid,
            gid,
            groups: Groups::new(groups.to_vec()),
        }
    }

    fn node(kind: Kind, mode: u32, uid: u32, gid: u32) -> Owner {
        Owner::new(kind, mode, uid, gid)
    }

    const ROOT: u32 = 0;
    const ALICE: u32 = 1000;
    const BOB: u32 = 1001;
    const STAFF: u32 = 50;

    #[test]
    fn the_first_class_that_applies_decides() {
        let f = node(Kind::File, 0o604, ALICE, STAFF);
        let alice = who(ALICE, 100, &[]);
        let staff = who(BOB, 100, &[STAFF]);
        let other = who(BOB, 100, &[]);
        assert!(permission(&alice, &f, MAY_READ | MAY_WRITE).is_ok());
        // The group class applies to a member, and gives nothing, though "other" may read.
        assert!(matches!(
            permission(&staff, &f, MAY_READ),
            Err(MetaError::Access(_))
        ));
        assert!(permission(&other, &f, MAY_READ).is_ok());
        assert!(permission(&other, &f, MAY_WRITE).is_err());
        // The primary group counts as well as supplementary ones.
        assert!(permission(&who(BOB, STAFF, &[]), &f, MAY_READ).is_err());
    }

    #[test]
    fn the_superuser_passes_all_but_execute_of_a_file_no_one_may_execute() {
        let root = who(ROOT, ROOT, &[]);
        let secret = node(Kind::File, 0o600, ALICE, ALICE);
        assert!(permission(&root, &secret, MAY_READ | MAY_WRITE).is_ok());
        assert!(permission(&root, &secret, MAY_EXEC).is_err());
        assert!(permission(&root, &node(Kind::File, 0o001, ALICE, ALICE), MAY_EXEC).is_ok());
        assert!(permission(&root, &node(Kind::Dir, 0o000, ALICE, ALICE), MAY_EXEC).is_ok());
    }

    #[test]
    fn sticky_directories_keep_names_to_their_owners() {
        let tmp = node(Kind::Dir, 0o1777, ROOT, ROOT);
        let bobs = node(Kind::File, 0o666, BOB, BOB);
        assert!(matches!(
            may_delete(&who(ALICE, ALICE, &[]), &tmp, &bobs),
            Err(MetaError::NotPermitted(_))
        ));
        assert!(may_delete(&who(BOB, BOB, &[]), &tmp, &bobs).is_ok());
        assert!(may_delete(&who(ROOT, ROOT, &[]), &tmp, &bobs).is_ok());
        let alices_tmp = node(Kind::Dir, 0o1777, ALICE, ALICE);
        assert!(may_delete(&who(ALICE, ALICE, &[]), &alices_tmp, &bobs).is_ok());
        // Without write on the directory, no one but root removes anything.
        let closed = node(Kind::Dir, 0o755, ROOT, ROOT);
        assert!(may_delete(&who(BOB, BOB, &[]), &closed, &bobs).is_err());
    }

    #[test]
    fn setgid_directories_give_their_group() {
        let shared = node(Kind::Dir, 0o2775, ROOT, STAFF);
        let alice = who(ALICE, ALICE, &[STAFF]);
        assert_eq!(
            new_owner(&alice, &shared, Kind::Dir, 7, 7, 0o755),
            (ALICE, STAFF, 0o2755)
        );
        assert_eq!(
            new_owner(&alice, &shared, Kind::File, 7, 7, 0o644),
            (ALICE, STAFF, 0o644)
        );
        // A non-member's new setgid-executable file loses setgid.
        let bob = who(BOB, BOB, &[]);
        assert_eq!(
            new_owner(&bob, &shared, Kind::File, 7, 7, 0o2755),
            (BOB, STAFF, 0o755)
        );
        let plain = node(Kind::Dir, 0o777, ROOT, ROOT);
        assert_eq!(
            new_owner(&bob, &plain, Kind::File, 7, 7, 0o644),
            (BOB, BOB, 0o644)
        );
        let root = who(ROOT, ROOT, &[]);
        assert_eq!(
            new_owner(&root, &plain, Kind::File, 7, 8, 0o644),
            (7, 8, 0o644)
        );
    }

    #[test]
    fn chmod_chown_and_times_follow_setattr_prepare() {
        let f = node(Kind::File, 0o6755, ALICE, ALICE);
        let alice = who(ALICE, ALICE, &[STAFF]);
        let bob = who(BOB, BOB, &[]);
        let root = who(ROOT, ROOT, &[]);
        let change = |f: fn(&mut SetAttr)| {
            let mut c = SetAttr::default();
            f(&mut c);
            c
        };
        let chmod = change(|c| c.mode = Some(0o600));
        assert_eq!(setattr(&alice, &f, &chmod), Ok(0o600));
        assert!(matches!(
            setattr(&bob, &f, &chmod),
            Err(MetaError::NotPermitted(_))
        ));
        // chown: root only; chgrp by the owner to one of its groups only.
        let give = change(|c| c.uid = Some(BOB));
        assert!(setattr(&alice, &f, &give).is_err());
        assert_eq!(
            setattr(&root, &f, &give),
            Ok(0o755),
            "chown takes setuid and setgid"
        );
        assert!(setattr(&alice, &f, &change(|c| c.gid = Some(STAFF))).is_ok());
        assert!(setattr(&alice, &f, &change(|c| c.gid = Some(999))).is_err());
        // A chmod keeping setgid on a group the caller is not in loses it.
        let staff_file = node(Kind::File, 0o755, ALICE, 999);
        assert_eq!(
            setattr(&alice, &staff_file, &change(|c| c.mode = Some(0o2755))),
            Ok(0o755)
        );
        // Explicit times: owner or root; "now": also anyone who may write.
        let shared = node(Kind::File, 0o666, ALICE, ALICE);
        let at = change(|c| c.mtime = Some(SetTime::At(1)));
        let now = change(|c| c.mtime = Some(SetTime::Now));
        assert!(setattr(&bob, &shared, &at).is_err());
        assert!(setattr(&bob, &shared, &now).is_ok());
        assert!(setattr(&bob, &node(Kind::File, 0o644, ALICE, ALICE), &now).is_err());
        // A truncate by someone else who may write takes setuid away.
        let suid = node(Kind::File, 0o4777, ALICE, ALICE);
        assert_eq!(
            setattr(&bob, &suid, &change(|c| c.size = Some(0))),
            Ok(0o777)
        );
        assert!(
            setattr(
                &bob,
                &node(Kind::File, 0o644, ALICE, ALICE),
                &change(|c| c.size = Some(0))
            )
            .is_err()
        );
    }

    #[test]
    fn xattr_namespaces() {
        let f = node(Kind::File, 0o644, ALICE, ALICE);
        let alice = who(ALICE, ALICE, &[]);
        let bob = who(BOB, BOB, &[]);
        let root = who(ROOT, ROOT, &[]);
        assert!(may_set_xattr(&alice, &f, b"user.x").is_ok());
        assert!(matches!(
            may_set_xattr(&bob, &f, b"user.x"),
            Err(MetaError::Access(_))
        ));
        assert!(may_get_xattr(&bob, &f, b"user.x").is_ok());
        assert!(matches!(
            may_set_xattr(&alice, &f, b"trusted.x"),
            Err(MetaError::NotPermitted(_))
        ));
        assert_eq!(
            may_get_xattr(&alice, &f, b"trusted.x"),
            Err(MetaError::NoData)
        );
        assert!(may_set_xattr(&root, &f, b"trusted.x").is_ok());
        assert!(may_set_xattr(&alice, &f, b"security.x").is_err());
        assert!(may_get_xattr(&bob, &f, b"security.x").is_ok());
        let link = node(Kind::Symlink, 0o777, ALICE, ALICE);
        assert!(matches!(
            may_set_xattr(&alice, &link, b"user.x"),
            Err(MetaError::NotPermitted(_))
        ));
        // ACLs: their owner's or the superuser's to set, anyone's to read.
        assert!(may_set_xattr(&alice, &f, b"system.posix_acl_access").is_ok());
        assert!(matches!(
            may_set_xattr(&bob, &f, b"system.posix_acl_default"),
            Err(MetaError::NotPermitted(_))
        ));
        assert!(may_get_xattr(&bob, &f, b"system.posix_acl_access").is_ok());
        assert!(matches!(
            may_set_xattr(&root, &f, b"system.other"),
            Err(MetaError::NotSupported(_))
        ));
        assert!(!lists_xattr(&alice, b"trusted.x"));
        assert!(lists_xattr(&root, b"trusted.x"));
    }

    #[test]
    fn hard_links_to_others_files_are_protected() {
        let alice = who(ALICE, ALICE, &[]);
        assert!(may_link(&alice, &node(Kind::File, 0o600, BOB, BOB)).is_err());
        assert!(may_link(&alice, &node(Kind::File, 0o666, BOB, BOB)).is_ok());
        assert!(may_link(&alice, &node(Kind::File, 0o4777, BOB, BOB)).is_err());
        assert!(may_link(&alice, &node(Kind::Fifo, 0o666, BOB, BOB)).is_err());
        assert!(may_link(&alice, &node(Kind::File, 0o600, ALICE, BOB)).is_ok());
    }
}
