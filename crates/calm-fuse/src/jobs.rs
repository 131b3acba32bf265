//! The job each process calling the mount belongs to, as a batch system names it in the
//! process's environment (`calm mount --job-variable SLURM_JOB_ID`): read from
//! `/proc/PID/environ` once per process (kept [`JOBS_TTL`], so a reused pid is read again) and
//! sent with its requests, so that the server counts its load per job.

use calm_types::sync::Locked;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a pid's job is reused before it is read again.
pub const JOBS_TTL: Duration = Duration::from_secs(10);
/// Pids whose jobs are kept; past it the table starts over.
pub const JOBS_PIDS_MAX: usize = 4096;

/// When a pid's job was read, and what it was.
type Known = (Instant, Option<Arc<str>>);

/// The jobs of recent callers.
#[derive(Debug, Default)]
pub struct CallerJobs {
    /// The variable naming a process's job (`None`: jobs are not sent).
    variable: Option<Vec<u8>>,
    known: Mutex<HashMap<u32, Known>>,
}

impl CallerJobs {
    /// Jobs named by the environment variable `variable` (`None`: none).
    pub fn new(variable: Option<&str>) -> CallerJobs {
        CallerJobs {
            variable: variable.map(|v| v.as_bytes().to_vec()),
            known: Mutex::default(),
        }
    }

    /// The job of process (or thread) `pid`; none when the mount sends no jobs, the process
    /// does not name one, is gone, or its environment cannot be read.
    pub fn of(&self, pid: u32) -> Option<Arc<str>> {
        let variable = self.variable.as_deref()?;
        let now = Instant::now();
        if let Some((at, job)) = self.known.locked().get(&pid)
            && now.duration_since(*at) < JOBS_TTL
        {
            return job.clone();
        }
        let job = std::fs::read(format!("/proc/{pid}/environ"))
            .ok()
            .and_then(|environ| job_in(&environ, variable))
            .map(Arc::from);
        let mut known = self.known.locked();
        if known.len() >= JOBS_PIDS_MAX {
            known.clear();
        }
        known.insert(pid, (now, job.clone()));
        job
    }
}

/// The value of `variable` in an environment block (`NAME=VALUE` entries, NUL-separated),
/// keeping letters, digits and `._:-` (what a request's metadata may carry), at most
/// `calm_metrics::LOAD_KEY_BYTES_MAX` of them; `None` when unset or nothing is left.
pub fn job_in(environ: &[u8], variable: &[u8]) -> Option<String> {
    let value = environ.split(|b| *b == 0).find_map(|entry| {
        entry
            .strip_prefix(variable)
            .and_then(|rest| rest.strip_prefix(b"="))
    })?;
    let job: String = value
        .iter()
        .filter(|b| b.is_ascii_alphanumeric() || b"._:-".contains(b))
        .take(calm_metrics::LOAD_KEY_BYTES_MAX)
        .map(|b| *b as char)
        .collect();
    (!job.is_empty()).then_some(job)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_the_variable_s_value_cleaned_and_bounded() {
        let environ = b"HOME=/root\0SLURM_JOB_ID_X=9\0SLURM_JOB_ID=4242\0PATH=/bin\0";
        assert_eq!(job_in(environ, b"SLURM_JOB_ID").as_deref(), Some("4242"));
        assert_eq!(job_in(environ, b"MISSING"), None);
        assert_eq!(job_in(b"J=a b\nc\"d\0", b"J").as_deref(), Some("abcd"));
        assert_eq!(job_in(b"J=\0", b"J"), None);
        let long = format!("J={}\0", "7".repeat(500));
        assert_eq!(
            job_in(long.as_bytes(), b"J").map(|j| j.len()),
            Some(calm_metrics::LOAD_KEY_BYTES_MAX)
        );
    }

    #[test]
    fn this_process_s_job_is_read_from_its_environment() {
        // The test's own environment: PATH is set in any test run.
        let jobs = CallerJobs::new(Some("PATH"));
        let pid = std::process::id();
        assert!(jobs.of(pid).is_some());
        assert_eq!(CallerJobs::new(None).of(pid), None);
    }
}
