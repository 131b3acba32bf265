//! The checks of the changelog: its records decode and are dense, and its readers'
//! positions lie within them.

use super::*;

impl Checker {
    pub(super) fn changelog_record(&mut self, index: u64, value: &[u8]) {
        self.enter(Phase::After);
        self.report.bytes_read += value.len() as u64;
        self.report.changelog_records += 1;
        if let Err(error) = calm_changelog::Record::decode(index, value) {
            self.report
                .problem(format!("changelog record {index}: {error}"));
        }
        match self.cl_range {
            None => self.cl_range = Some((index, index)),
            Some((first, last)) => {
                if index != last + 1 {
                    self.report.problem(format!(
                        "changelog records {last} and {index} are stored with a gap between"
                    ));
                }
                self.cl_range = Some((first, index));
            }
        }
    }

    /// Records end at `Ncl_last`; every reader's uncleared records are stored; reader ids
    /// are below `Ncl_user_next`.
    pub(super) fn check_changelog(&mut self) {
        let counter = |key: &[u8]| {
            self.counters
                .iter()
                .find(|(k, _)| k == key)
                .map_or(0, |(_, n)| *n)
        };
        let (counted, user_next) = (counter(KEY_CL_LAST), counter(KEY_CL_USER_NEXT));
        self.report.changelog_readers = self.cl_users.len() as u64;
        // The counter is written by purges only: it may lag the records, never lead them.
        let last = match self.cl_range {
            Some((_, stored_last)) if stored_last < counted => {
                self.report.problem(format!(
                    "the last changelog record stored is {stored_last}, below the counter's {counted}"
                ));
                counted
            }
            Some((_, stored_last)) => stored_last,
            None => counted,
        };
        let mut problems = Vec::new();
        for user in &self.cl_users {
            if u64::from(user.id) >= user_next {
                problems.push(format!(
                    "changelog reader cl{} at or above the next id {user_next}",
                    user.id
                ));
            }
            if user.cleared > last {
                problems.push(format!(
                    "changelog reader cl{} cleared {} past the last record {last}",
                    user.id, user.cleared
                ));
            } else if user.cleared < last {
                let needed = user.cleared + 1;
                if self.cl_range.is_none_or(|(first, _)| first > needed) {
                    problems.push(format!(
                        "changelog reader cl{} needs record {needed}, which is not stored",
                        user.id
                    ));
                }
            }
        }
        for problem in problems {
            self.report.problem(problem);
        }
    }
}
