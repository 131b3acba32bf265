//! Byte ranges and lock types: what a request names, checked the way Linux checks
//! `struct flock` (EINVAL for a range below 0, EOVERFLOW past `OFFSET_MAX`).

/// The largest byte offset a lock can reach: `i64::MAX`, as `off_t` (OFFSET_MAX).
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// Read (shared) or write (exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockKind {
    Read,
    Write,
}

impl LockKind {
    /// Whether locks of these types held by two different owners may not overlap.
    pub fn conflicts_with(self, other: LockKind) -> bool {
        self == LockKind::Write || other == LockKind::Write
    }
}

/// An inclusive byte range `[start, end]`, `end <= OFFSET_MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Range {
    pub start: u64,
    pub end: u64,
}

/// Why a range is refused, with the errno Linux gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeError {
    /// EINVAL: a negative start, or a negative length reaching below 0.
    Invalid,
    /// EOVERFLOW: the range reaches past OFFSET_MAX.
    Overflow,
}

impl Range {
    /// The range of `struct flock`'s absolute `l_start` and `l_len`: `len == 0` means "to the
    /// end of any file", a negative `len` covers `[start + len, start - 1]`.
    pub fn from_posix(start: i64, len: i64) -> Result<Range, RangeError> {
        if start < 0 {
            return Err(RangeError::Invalid);
        }
        let (start, end) = match len {
            0 => (start, i64::MAX),
            len if len > 0 => {
                let end = start.checked_add(len - 1).ok_or(RangeError::Overflow)?;
                (start, end)
            }
            len => {
                let first = start.checked_add(len).ok_or(RangeError::Invalid)?;
                if first < 0 {
                    return Err(RangeError::Invalid);
                }
                (first, start - 1)
            }
        };
        if end < start {
            return Err(RangeError::Invalid);
        }
        Ok(Range {
            start: start as u64,
            end: end as u64,
        })
    }

    pub fn overlaps(&self, other: &Range) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64) -> Range {
        Range { start, end }
    }

    #[test]
    fn posix_ranges() {
        assert_eq!(Range::from_posix(5, 0), Ok(r(5, OFFSET_MAX)));
        assert_eq!(Range::from_posix(5, 3), Ok(r(5, 7)));
        assert_eq!(Range::from_posix(5, -3), Ok(r(2, 4)));
        assert_eq!(Range::from_posix(5, -5), Ok(r(0, 4)));
        assert_eq!(Range::from_posix(5, -6), Err(RangeError::Invalid));
        assert_eq!(Range::from_posix(-1, 1), Err(RangeError::Invalid));
        assert_eq!(Range::from_posix(i64::MAX, 2), Err(RangeError::Overflow));
        assert_eq!(Range::from_posix(0, i64::MIN), Err(RangeError::Invalid));
        assert_eq!(
            Range::from_posix(i64::MAX, 1),
            Ok(r(OFFSET_MAX, OFFSET_MAX))
        );
        assert_eq!(
            Range::from_posix(i64::MAX, 0),
            Ok(r(OFFSET_MAX, OFFSET_MAX))
        );
    }
}
