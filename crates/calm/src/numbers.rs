//! Numeric arguments given as decimals (hours, seconds): a finite number within a named
//! range, or a clear error; never a panic or a silent default.

/// Most hours anything is kept or waited for (ten years).
pub const HOURS_MAX: f64 = 87_600.0;
/// Least time between two backups, in hours (a second; each is a whole dump, so an interval
/// this short is for tests).
pub const BACKUP_EVERY_HOURS_MIN: f64 = 1.0 / 3600.0;
/// Most seconds of the stats' interval and of a file's age that skips the trash (a day).
pub const SECONDS_MAX: f64 = 86_400.0;
/// Least seconds between two samples of `calm stats`.
pub const INTERVAL_S_MIN: f64 = 0.1;

fn number(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if value.is_finite() {
        Ok(value)
    } else {
        Err(format!("{text} is not a finite number"))
    }
}

/// A parser of a number from `min` to `max`.
fn within(
    min: f64,
    max: f64,
    unit: &'static str,
) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |text| {
        let value = number(text)?;
        if (min..=max).contains(&value) {
            Ok(value)
        } else {
            Err(format!("{text} is outside {min}–{max} {unit}"))
        }
    }
}

/// Hours from 0 to [`HOURS_MAX`].
pub fn hours(text: &str) -> Result<f64, String> {
    within(0.0, HOURS_MAX, "hours")(text)
}

/// Hours between backups: 0 (never), or from [`BACKUP_EVERY_HOURS_MIN`] to [`HOURS_MAX`].
pub fn backup_hours(text: &str) -> Result<f64, String> {
    let value = hours(text)?;
    if value != 0.0 && value < BACKUP_EVERY_HOURS_MIN {
        return Err(format!(
            "{text} is less than a second between two backups (each a whole dump): give 0 \
             for none, or at least {BACKUP_EVERY_HOURS_MIN:.6} hours (a second)"
        ));
    }
    Ok(value)
}

/// Seconds from 0 to [`SECONDS_MAX`].
pub fn seconds(text: &str) -> Result<f64, String> {
    within(0.0, SECONDS_MAX, "seconds")(text)
}

/// The seconds between two samples, from [`INTERVAL_S_MIN`] to [`SECONDS_MAX`].
pub fn interval_s(text: &str) -> Result<f64, String> {
    within(INTERVAL_S_MIN, SECONDS_MAX, "seconds")(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_outside_their_range_are_refused_clearly() {
        for bad in ["nan", "NaN", "inf", "-inf", "1e308", "1e300", "-1", "x", ""] {
            assert!(hours(bad).is_err(), "{bad}");
            assert!(backup_hours(bad).is_err(), "{bad}");
            assert!(seconds(bad).is_err(), "{bad}");
            assert!(interval_s(bad).is_err(), "{bad}");
        }
        assert_eq!(hours("24"), Ok(24.0));
        assert_eq!(hours("0"), Ok(0.0));
        assert_eq!(backup_hours("0"), Ok(0.0));
        assert_eq!(backup_hours("0.5"), Ok(0.5));
        assert_eq!(backup_hours("0.0005"), Ok(0.0005));
        assert!(
            backup_hours("1e-9")
                .unwrap_err()
                .contains("less than a second")
        );
        assert!(interval_s("0.01").is_err());
        assert_eq!(interval_s("0.1"), Ok(0.1));
        assert!(
            hours("87601")
                .unwrap_err()
                .contains("outside 0–87600 hours")
        );
    }
}
