//! A server's data directory: closed to others but for its socket, and locked against a second
//! server on the same store.

use std::fs::File;
use std::path::Path;

use crate::SOCKET_FILE;

/// Name of the lock file that keeps two servers off one data directory.
pub const LOCK_FILE: &str = "calm.lock";

/// Mode of a data directory: others may only reach the socket in it.
pub const DATA_DIR_MODE: u32 = 0o711;

/// Makes what the server creates from now on readable by its own user alone (umask 077: files
/// 0600, directories 0700), whatever the caller's umask. Process-wide; called by `calm serve`
/// and the embedded mount before they open anything.
pub fn private_files() {
    // SAFETY: umask(2) only sets the process's file creation mask.
    unsafe { libc::umask(0o077) };
}

/// Creates the data directory (mode [`DATA_DIR_MODE`]) or checks an existing one: the
/// directory and every entry in it must belong to the server's user (refused otherwise), and
/// the directory itself and every entry in it but the socket must be closed to group and others
/// (the store's files, its write-ahead log, the record log and object directories). Modes
/// that are too open — a store made by an older calm, or changed by hand — are closed, each
/// named in the returned list (the caller warns). Only the top level is read: what lies in
/// the closed subdirectories cannot be reached by others whatever its own mode, and a start
/// never walks the object tree.
pub fn secure_data_dir(dir: &Path) -> Result<Vec<String>, String> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let mut fixed = Vec::new();
    safe_ancestors(dir)?;
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DATA_DIR_MODE)
            .create(dir)
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        // The mode as asked, whatever the umask.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DATA_DIR_MODE))
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let mut close = |path: &Path| -> Result<(), String> {
        let meta = owned(path)?;
        let mode = meta.permissions().mode() & 0o7777;
        // The directory may keep search permission for others (the socket); a directory
        // closed further by its administrator stays so.
        let open = if path == dir { 0o066 } else { 0o077 };
        if mode & open != 0 && !meta.file_type().is_symlink() {
            let mode_now = mode & !open;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode_now))
                .map_err(|e| format!("closing {}: {e}", path.display()))?;
            fixed.push(format!("{} was {mode:o}, now {mode_now:o}", path.display()));
        }
        Ok(())
    };
    close(dir)?;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        if entry.file_name() == SOCKET_FILE {
            owned(&entry.path())?;
            continue;
        }
        close(&entry.path())?;
    }
    Ok(fixed)
}

/// Refuses a data directory that someone else could move away or replace while it is served:
/// every directory above it must belong to the superuser or the server's user, and one that
/// others may write must be sticky (as /tmp is: only an entry's owner moves it).
/// Checked before a missing data directory is made (from the nearest directory that exists).
fn safe_ancestors(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let absolute = std::path::absolute(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut existing = absolute.as_path();
    while !existing.exists() {
        existing = existing.parent().unwrap_or(Path::new("/"));
    }
    let real = std::fs::canonicalize(existing).map_err(|e| format!("{}: {e}", dir.display()))?;
    // SAFETY: geteuid(2) only reads the process's user.
    let me = unsafe { libc::geteuid() };
    let own = usize::from(existing == absolute.as_path());
    for above in real.ancestors().skip(own) {
        let meta = std::fs::metadata(above).map_err(|e| format!("{}: {e}", above.display()))?;
        if meta.uid() != 0 && meta.uid() != me {
            return Err(format!(
                "{} is in {}, which belongs to uid {}: its owner could move the data directory                  away or put another in its place while it is served (give a directory whose                  every parent is the superuser's or this server's user's)",
                dir.display(),
                above.display(),
                meta.uid()
            ));
        }
        let mode = meta.mode();
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(format!(
                "{} is in {}, which others may write (mode {:o}) and is not sticky: they could                  move the data directory away or put another in its place while it is served",
                dir.display(),
                above.display(),
                mode & 0o7777
            ));
        }
    }
    Ok(())
}

/// `path`'s metadata, if it belongs to the server's user: whoever owns the data directory or
/// an entry in it could put their own socket or store in the server's place.
fn owned(path: &Path) -> Result<std::fs::Metadata, String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: geteuid(2) only reads the process's user.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not to this server's user (uid {me}): a data directory and \
             what is in it must be the server's own (give another directory, or have its owner \
             run the server)",
            path.display(),
            meta.uid()
        ));
    }
    Ok(meta)
}

/// Takes the data directory's lock, so that a second server on the same directory is refused
/// with a clear error instead of sharing the store. Held for as long as the returned file lives.
/// Creates the directory, or closes it to others ([`secure_data_dir`]).
pub fn lock_data_dir(dir: &Path) -> Result<File, String> {
    for fixed in secure_data_dir(dir)? {
        tracing::warn!("data directory open to others: {fixed}");
    }
    let path = dir.join(LOCK_FILE);
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "{} is in use by another calm server (lock {} is held)",
            dir.display(),
            path.display()
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(format!("locking {}: {e}", path.display())),
    }
}
