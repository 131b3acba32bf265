use super::*;
use crate::error::MetaError;

const SEC: i64 = 1_000_000_000;

fn usage(bytes: i64, inodes: i64) -> QuotaUsage {
    QuotaUsage {
        bytes,
        inodes,
        dirs: 0,
    }
}

fn limited(bytes: u64, soft_bytes: u64, grace_s: u64) -> Stored {
    Stored {
        limits: QuotaLimits {
            bytes,
            soft_bytes,
            grace_s,
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn a_hard_limit_is_reached_and_never_passed() {
    let t = QuotaTarget::user(7);
    let s = limited(100, 0, 0);
    assert!(judge(t, &s, usage(0, 0), usage(100, 0), SEC).is_ok());
    let refused = judge(t, &s, usage(100, 0), usage(101, 0), SEC).unwrap_err();
    assert!(matches!(refused, MetaError::QuotaExceeded(_)), "{refused}");
    assert!(refused.to_string().contains("user 7"), "{refused}");
    // Shrinking past it (a limit set below the usage) is never refused.
    assert!(judge(t, &s, usage(300, 0), usage(200, 0), SEC).is_ok());
}

#[test]
fn a_soft_limit_holds_after_its_grace_and_its_clock_stops_under_it() {
    let t = QuotaTarget::tree(5);
    let s = limited(0, 100, 10);
    let past = judge(t, &s, usage(90, 0), usage(150, 0), 3 * SEC).unwrap();
    assert_eq!(past.bytes_over_since_ns, 3 * SEC);
    // Within the grace: growth goes on, the clock keeps its start.
    let still = judge(t, &past, usage(150, 0), usage(160, 0), 12 * SEC).unwrap();
    assert_eq!(still.bytes_over_since_ns, 3 * SEC);
    // Past it: refused.
    assert!(judge(t, &still, usage(160, 0), usage(161, 0), 14 * SEC).is_err());
    // Back under the soft limit: the clock stops, growth is allowed again.
    let under = judge(t, &still, usage(160, 0), usage(50, 0), 20 * SEC).unwrap();
    assert_eq!(under.bytes_over_since_ns, 0);
    assert!(judge(t, &under, usage(50, 0), usage(120, 0), 30 * SEC).is_ok());
}

#[test]
fn inodes_are_judged_apart_from_bytes() {
    let t = QuotaTarget::group(3);
    let s = Stored {
        limits: QuotaLimits {
            inodes: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(judge(t, &s, usage(0, 1), usage(1 << 40, 2), SEC).is_ok());
    assert!(judge(t, &s, usage(0, 2), usage(0, 3), SEC).is_err());
}

#[test]
fn records_round_trip() {
    let s = Stored {
        limits: QuotaLimits {
            bytes: 1,
            inodes: 2,
            soft_bytes: 3,
            soft_inodes: 4,
            grace_s: 5,
        },
        bytes_over_since_ns: 6,
        inodes_over_since_ns: -7,
    };
    assert_eq!(Stored::decode(&s.encode()).unwrap(), s);
    let u = QuotaUsage {
        bytes: -1,
        inodes: 2,
        dirs: 3,
    };
    assert_eq!(decode_usage(&encode_usage(&u)).unwrap(), u);
    let target = QuotaTarget::tree(0x0102_0304);
    assert_eq!(key_target(&usage_key(target)), Some(target));
    assert!(Stored::decode(&[0; 55]).is_err());
}
