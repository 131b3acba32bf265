//! The files the write-ahead log and the record log keep, behind one seam.
//!
//! Every write and sync of a log segment, a checkpoint slot, the data file's meta pages and
//! fsync, and a record log file goes through [`DiskFile`]. In a build for a site it is a
//! `File` and nothing more. The crate's tests arm a fault plan on a store's directory
//! (`faults`): the Nth write or sync of a file under it fails (EIO, or ENOSPC after writing
//! part of its bytes), or the process "dies" there (a write keeps a torn prefix, nothing later
//! reaches the files, and with a power loss every write not synced is undone); the store
//! reopened afterwards is checked against a model of what was acknowledged (`model`).
//!
//! Not behind the seam: directory entries (creating, renaming and removing files; directory
//! fsyncs) and the pages LMDB writes into `data.mdb` itself.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

#[cfg(test)]
pub(crate) mod faults;
#[cfg(test)]
mod model;

/// A file the logs write, as [`std::fs::File`] for the calls they make.
#[derive(Debug)]
pub(crate) struct DiskFile {
    file: File,
    /// The fault plan this file takes part in, if its directory has one.
    #[cfg(test)]
    tracked: Option<faults::Tracked>,
}

impl DiskFile {
    pub(crate) fn open(path: &Path, options: &OpenOptions) -> io::Result<DiskFile> {
        let file = options.open(path)?;
        Ok(DiskFile {
            #[cfg(test)]
            tracked: faults::track(path, &file)?,
            file,
        })
    }

    /// A second descriptor of the same open file.
    pub(crate) fn try_clone(&self) -> io::Result<DiskFile> {
        Ok(DiskFile {
            file: self.file.try_clone()?,
            #[cfg(test)]
            tracked: self.tracked.clone(),
        })
    }

    pub(crate) fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        #[cfg(test)]
        if let Some(tracked) = &self.tracked {
            return tracked.write_all_at(&self.file, buf, offset);
        }
        self.file.write_all_at(buf, offset)
    }

    pub(crate) fn sync_data(&self) -> io::Result<()> {
        #[cfg(test)]
        if let Some(tracked) = &self.tracked {
            return tracked.sync(|| self.file.sync_data());
        }
        self.file.sync_data()
    }

    pub(crate) fn sync_all(&self) -> io::Result<()> {
        #[cfg(test)]
        if let Some(tracked) = &self.tracked {
            return tracked.sync(|| self.file.sync_all());
        }
        self.file.sync_all()
    }

    pub(crate) fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }

    pub(crate) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    pub(crate) fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    /// Takes the file's exclusive advisory lock without waiting.
    pub(crate) fn try_lock(&self) -> Result<(), std::fs::TryLockError> {
        self.file.try_lock()
    }
}
