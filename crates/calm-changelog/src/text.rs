//! Records as a person reads them: Lustre's `lfs changelog` line, with the time in UTC.

use crate::record::Record;

/// Lustre's `lfs changelog` line: `index NNTYPE HH:MM:SS.ffffffff YYYY.MM.DD flags
/// t=[target:gen] p=[parent] name` (and ` s=[source parent] source name` for RENME).
pub fn line(record: &Record) -> String {
    let (date, time) = utc(record.time_ns);
    let mut line = format!(
        "{} {:02}{} {time} {date} {:#x} t=[{:#x}:{:#x}] p=[{:#x}] {}",
        record.index,
        record.kind as u8,
        record.kind.name(),
        record.flags,
        record.target,
        record.generation,
        record.parent,
        String::from_utf8_lossy(&record.name)
    );
    if let Some(rename) = &record.rename {
        line.push_str(&format!(
            " s=[{:#x}] {}",
            rename.source_parent,
            String::from_utf8_lossy(&rename.source_name)
        ));
        if record.flags & crate::record::flags::OVERWRITE != 0 {
            line.push_str(&format!(" o=[{:#x}]", rename.overwritten));
        }
    }
    line
}

/// `(YYYY.MM.DD, HH:MM:SS.nnnnnnnnn)` in UTC.
pub fn utc(time_ns: i64) -> (String, String) {
    let secs = time_ns.div_euclid(1_000_000_000);
    let nanos = time_ns.rem_euclid(1_000_000_000);
    let (days, day_secs) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        format!("{year:04}.{month:02}.{day:02}"),
        format!(
            "{:02}:{:02}:{:02}.{nanos:09}",
            day_secs / 3600,
            day_secs % 3600 / 60,
            day_secs % 60
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), ("1970.01.01".into(), "00:00:00.000000000".into()));
        // 2026-11-22 10:35:26.5 UTC
        let t = 1_795_343_726_500_000_000;
        assert_eq!(utc(t), ("2026.11.22".into(), "10:35:26.500000000".into()));
        assert_eq!(utc(951_782_400 * 1_000_000_000).0, "2000.02.29");
    }
}
