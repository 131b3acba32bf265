//! The namespace's tests, one module per part, in one test binary (one link instead of one per
//! file): models of the namespace, its data, ACLs, quotas and changelog against small obviously
//! correct ones, and the namespace on LMDB.

mod acl_model;
mod changelog;
mod changelog_model;
mod clone;
mod collected;
mod data_model;
mod decoders;
mod dump;
mod grants;
mod model;
mod namespace;
mod orphans;
mod quota_model;
mod quota_shares;
mod replaced;
mod trash;
