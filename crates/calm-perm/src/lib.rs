//! `calm-perm`: who may do what, as Linux decides it: the permission bits with supplementary
//! groups, sticky directories, setuid and setgid, who may chmod, chown and set times, the
//! xattr namespaces ([`perm`]), and POSIX ACLs by the rules of acl(5) ([`acl`]). Pure:
//! attributes, an ACL and a caller in, a decision out; it needs only the vocabulary
//! (`calm-types`), so the rules can be read, tested and reused without the namespace.

pub mod acl;
pub mod perm;
