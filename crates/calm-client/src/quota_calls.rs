//! Quota calls: set (the superuser), read, list, check; and a tree's summary.

use calm_types::quota::QuotaMismatch;
use calm_types::{Handle, QuotaLimits, QuotaReport, QuotaTarget, QuotaUsage};

use super::*;
use calm_proto::quota::{
    limits_to_wire, mismatch_from_wire, report_from_wire, target_to_wire, usage_from_wire,
};

impl Client {
    /// Sets `target`'s limits (all 0: removes them); the quota as it is then.
    pub async fn set_quota(&self, target: QuotaTarget, limits: QuotaLimits) -> Result<QuotaReport> {
        let request = pb::SetQuotaRequest {
            target: Some(target_to_wire(target)),
            limits: Some(limits_to_wire(limits)),
        };
        let reply = self.mutated(meta_call!(mutation self, set_quota, request))?;
        report_from_wire(&reply)
    }

    pub async fn quota(&self, target: QuotaTarget) -> Result<QuotaReport> {
        report_from_wire(&check(meta_call!(self, get_quota, target_to_wire(target)))?)
    }

    /// Every quota with a limit the caller may see; `all`: users and groups without one too.
    pub async fn quotas(&self, all: bool) -> Result<Vec<QuotaReport>> {
        let reply = check(meta_call!(self, list_quotas, pb::QuotaListRequest { all }))?;
        reply.reports.iter().map(report_from_wire).collect()
    }

    /// Where the usage the server keeps differs from the namespace counted.
    pub async fn check_quotas(&self) -> Result<Vec<QuotaMismatch>> {
        let reply = check(meta_call!(unbounded self, check_quotas, pb::Empty {}))?;
        reply.mismatches.iter().map(mismatch_from_wire).collect()
    }

    /// The files, directories and bytes below `dir`, and whether they were read from its
    /// quota (else walked).
    pub async fn summary(&self, dir: Handle) -> Result<(QuotaUsage, bool)> {
        let reply = check(meta_call!(unbounded self, summary, pb::HandleRequest { handle: dir }))?;
        Ok((usage_from_wire(reply.usage.as_ref()), reply.kept))
    }
}
