//! `calm-node`: the storage-node agent. Today: [`mounts`], an exact in-memory mount table of a
//! mount namespace, kept from the kernel's mount events.

pub mod mounts;
