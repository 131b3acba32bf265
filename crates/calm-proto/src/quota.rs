//! Quotas on the wire: targets, limits, usage and reports, both ways.

use calm_types::quota::QuotaMismatch;
use calm_types::{MetaError, QuotaKind, QuotaLimits, QuotaReport, QuotaTarget, QuotaUsage};

use crate::pb;

pub fn target_to_wire(t: QuotaTarget) -> pb::QuotaTarget {
    pb::QuotaTarget {
        kind: u32::from(t.kind.tag()),
        id: t.id,
    }
}

pub fn target_from_wire(t: Option<&pb::QuotaTarget>) -> Result<QuotaTarget, MetaError> {
    let t = t.ok_or_else(|| MetaError::Invalid("a quota without its target".into()))?;
    let kind = u8::try_from(t.kind)
        .ok()
        .and_then(QuotaKind::from_tag)
        .ok_or_else(|| MetaError::Invalid(format!("quota kind {}", t.kind)))?;
    Ok(QuotaTarget { kind, id: t.id })
}

pub fn limits_to_wire(l: QuotaLimits) -> pb::QuotaLimits {
    pb::QuotaLimits {
        bytes: l.bytes,
        inodes: l.inodes,
        soft_bytes: l.soft_bytes,
        soft_inodes: l.soft_inodes,
        grace_s: l.grace_s,
    }
}

pub fn limits_from_wire(l: Option<&pb::QuotaLimits>) -> QuotaLimits {
    l.map_or_else(QuotaLimits::default, |l| QuotaLimits {
        bytes: l.bytes,
        inodes: l.inodes,
        soft_bytes: l.soft_bytes,
        soft_inodes: l.soft_inodes,
        grace_s: l.grace_s,
    })
}

pub fn usage_to_wire(u: QuotaUsage) -> pb::QuotaUsage {
    pb::QuotaUsage {
        bytes: u.bytes,
        inodes: u.inodes,
        dirs: u.dirs,
    }
}

pub fn usage_from_wire(u: Option<&pb::QuotaUsage>) -> QuotaUsage {
    u.map_or_else(QuotaUsage::default, |u| QuotaUsage {
        bytes: u.bytes,
        inodes: u.inodes,
        dirs: u.dirs,
    })
}

pub fn report_to_wire(r: &QuotaReport) -> pb::QuotaReport {
    pb::QuotaReport {
        target: Some(target_to_wire(r.target)),
        limits: Some(limits_to_wire(r.limits)),
        usage: Some(usage_to_wire(r.usage)),
        bytes_over_since_ns: r.bytes_over_since_ns,
        inodes_over_since_ns: r.inodes_over_since_ns,
    }
}

pub fn report_from_wire(r: &pb::QuotaReport) -> Result<QuotaReport, MetaError> {
    Ok(QuotaReport {
        target: target_from_wire(r.target.as_ref())?,
        limits: limits_from_wire(r.limits.as_ref()),
        usage: usage_from_wire(r.usage.as_ref()),
        bytes_over_since_ns: r.bytes_over_since_ns,
        inodes_over_since_ns: r.inodes_over_since_ns,
    })
}

pub fn mismatch_to_wire(m: &QuotaMismatch) -> pb::QuotaMismatch {
    pb::QuotaMismatch {
        target: Some(target_to_wire(m.target)),
        kept: Some(usage_to_wire(m.kept)),
        counted: Some(usage_to_wire(m.counted)),
    }
}

pub fn mismatch_from_wire(m: &pb::QuotaMismatch) -> Result<QuotaMismatch, MetaError> {
    Ok(QuotaMismatch {
        target: target_from_wire(m.target.as_ref())?,
        kept: usage_from_wire(m.kept.as_ref()),
        counted: usage_from_wire(m.counted.as_ref()),
    })
}
