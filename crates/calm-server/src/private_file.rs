//! Files calm writes for an administrator (a dump, a certificate and its key): written under a
//! fresh name nobody can guess beside the file asked for, created new (never through a link,
//! never into a file someone planted), readable by their owner alone unless asked otherwise,
//! made durable, then renamed into place whole. A write that fails or is dropped leaves
//! nothing behind; a reader never finds a half-written file under the name asked for.

use std::fs::{File, Permissions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Most bytes of the asked-for name kept in the staging file's name (a name of 255 bytes
/// would leave no room for the rest).
const NAME_BYTES_IN_STAGING: usize = 64;

/// A file being written, to be renamed into place by [`PrivateFile::persist`].
#[derive(Debug)]
pub struct PrivateFile {
    staged: tempfile::NamedTempFile,
    target: PathBuf,
}

impl PrivateFile {
    /// A new file for `target`, readable and writable by its owner alone (0600).
    pub fn create(target: &Path) -> io::Result<PrivateFile> {
        PrivateFile::with_mode(target, 0o600)
    }

    /// A new file for `target` with `mode` (less the process's umask): 0644 for what others
    /// must read, a certificate.
    pub fn with_mode(target: &Path, mode: u32) -> io::Result<PrivateFile> {
        let name = target.file_name().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} names no file", target.display()),
            )
        })?;
        let name = name.to_string_lossy();
        let mut end = name.len().min(NAME_BYTES_IN_STAGING);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        let staged = tempfile::Builder::new()
            .prefix(&format!(".{}.", &name[..end]))
            .suffix(".partial")
            .permissions(Permissions::from_mode(mode))
            .tempfile_in(directory_of(target))?;
        Ok(PrivateFile {
            staged,
            target: target.to_path_buf(),
        })
    }

    /// The file to write into.
    pub fn file(&mut self) -> &mut File {
        self.staged.as_file_mut()
    }

    /// Where it is written until [`PrivateFile::persist`] (it is removed if dropped before):
    /// a scratch file of its own when it is never persisted.
    pub fn path(&self) -> &Path {
        self.staged.path()
    }

    /// Makes the file durable and renames it to the name asked for (replacing what was
    /// there: a link is replaced, not followed), then makes the rename durable. Returns the
    /// file's length.
    pub fn persist(self) -> io::Result<u64> {
        let file = self.staged.as_file();
        file.sync_all()?;
        let length = file.metadata()?.len();
        self.staged
            .persist(&self.target)
            .map_err(|error| error.error)?;
        File::open(directory_of(&self.target))?.sync_all()?;
        Ok(length)
    }
}

fn directory_of(target: &Path) -> &Path {
    target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_file_appears_whole_under_its_name_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("dump");
        let mut file = PrivateFile::create(&target).unwrap();
        file.file().write_all(b"contents").unwrap();
        assert!(!target.exists(), "not under its name before it is whole");
        assert_eq!(file.persist().unwrap(), 8);
        assert_eq!(std::fs::read(&target).unwrap(), b"contents");
        assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o777, 0o600);
        assert_eq!(entries(dir.path()), vec!["dump"]);
    }

    #[test]
    fn a_link_at_the_name_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let target = dir.path().join("dump");
        std::os::unix::fs::symlink(&victim, &target).unwrap();
        let mut file = PrivateFile::create(&target).unwrap();
        file.file().write_all(b"new").unwrap();
        file.persist().unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(!std::fs::symlink_metadata(&target).unwrap().is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
    }

    #[test]
    fn a_file_dropped_before_it_is_whole_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("x".repeat(255));
        let mut file = PrivateFile::with_mode(&target, 0o644).unwrap();
        file.file().write_all(b"half").unwrap();
        drop(file);
        assert!(entries(dir.path()).is_empty());
    }
}
