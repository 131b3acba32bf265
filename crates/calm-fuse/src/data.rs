//! File contents: one object per handle, `DIR/objects/HH/HANDLE` (HH: the handle's low byte in
//! hex, so that no directory of the data directory grows past 1/256 of the files). Sizes and
//! times live in the metadata server; an object is never longer than the file's size, except
//! for the bytes of a write whose size has not been pushed to the server yet.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use calm_meta::Handle;

/// The data directory.
#[derive(Debug)]
pub struct Objects {
    root: PathBuf,
}

impl Objects {
    /// Opens (creating it when missing) the data directory `dir`.
    pub fn open(dir: &Path) -> io::Result<Objects> {
        let root = dir.join("objects");
        std::fs::create_dir_all(&root)?;
        Ok(Objects { root })
    }

    /// The directory holding the objects.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, handle: Handle) -> PathBuf {
        self.root
            .join(format!("{:02x}", handle & 0xff))
            .join(format!("{handle:016x}"))
    }

    /// The object of `handle`, created empty when missing.
    pub fn open_object(&self, handle: Handle) -> io::Result<File> {
        let path = self.path(handle);
        let open = |path: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
        };
        match open(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(path.parent().expect("objects have a parent"))?;
                open(&path)
            }
            other => other,
        }
    }

    /// Sets the length of `handle`'s object (truncate, or extend with zeros).
    /// The object stays (even at length 0): open descriptors of the file write to it.
    pub fn set_len(&self, handle: Handle, size: u64) -> io::Result<()> {
        self.open_object(handle)?.set_len(size)
    }

    /// Deletes `handle`'s object (its last link is gone and no one has it open).
    pub fn remove(&self, handle: Handle) -> io::Result<()> {
        match std::fs::remove_file(self.path(handle)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// Reads up to `len` bytes at `offset`, stopping at the object's end.
pub fn read_at(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(done);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_created_on_demand_truncated_and_removed() {
        let dir = std::env::temp_dir().join(format!("calm-objects-{}", std::process::id()));
        let objects = Objects::open(&dir).unwrap();
        let handle = 0x1234;
        let file = objects.open_object(handle).unwrap();
        file.write_all_at(b"hello world", 0).unwrap();
        assert_eq!(read_at(&file, 6, 100).unwrap(), b"world");
        objects.set_len(handle, 5).unwrap();
        assert_eq!(read_at(&file, 0, 100).unwrap(), b"hello");
        objects.set_len(handle, 8).unwrap();
        objects.set_len(handle, 0).unwrap();
        file.write_all_at(b"hello", 0).unwrap();
        assert_eq!(
            read_at(&objects.open_object(handle).unwrap(), 0, 100).unwrap(),
            b"hello",
            "a truncated object is the one open descriptors write to"
        );
        objects.set_len(handle, 8).unwrap();
        assert_eq!(read_at(&file, 0, 100).unwrap(), b"hello\0\0\0");
        assert!(dir.join("objects/34/0000000000001234").exists());
        objects.remove(handle).unwrap();
        objects.remove(handle).unwrap(); // already gone: not an error
        assert!(!dir.join("objects/34/0000000000001234").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
