//! A local-directory store's objects, written and read with plain file calls on the calling
//! thread (small objects) instead of a thread of the blocking pool per call: for a small file
//! the switch to that thread and back cost more than the write itself.
//!
//! The names and the conventions are `object_store`'s local store's, so that both read and
//! list the same directory: an object is written under `NAME#N` (created exclusively) and
//! renamed to `NAME`, so it appears whole or not at all; a missing directory is created.

use std::fs::File;
use std::io::{self, Write};
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};

/// Objects and reads up to this many bytes run on the calling thread; larger ones on the
/// blocking pool (a 4 MiB copy into the page cache holds a thread for about a millisecond).
pub const INLINE_BYTES_MAX: u64 = 256 << 10;

/// Staging names taken by this process (`NAME#N`); another process's are skipped (exclusive
/// create).
static NEXT_STAGING: AtomicU64 = AtomicU64::new(1);

/// Writes `parts` (header, data) as the object `path`: staged, then renamed.
pub fn put(path: &Path, parts: &[&[u8]]) -> io::Result<()> {
    staged(path, 0, &mut |file| {
        parts.iter().try_for_each(|part| file.write_all(part))
    })
}

/// The alignment O_DIRECT asks of buffers, file offsets and lengths (the page size: enough for
/// every device's logical block).
const DIRECT_ALIGN: usize = 4096;

/// Writes `header` then `data` as the object `path` with O_DIRECT (the bytes go from memory
/// to the device, without a copy into the page cache, which for a stream of full blocks
/// costs more CPU than everything else the mount does): staged, then renamed, as [`put`].
/// The file is written padded to [`DIRECT_ALIGN`], then cut to its length. A file system
/// without O_DIRECT (tmpfs) gets [`put`].
pub fn put_direct(path: &Path, header: &[u8], data: &[u8]) -> io::Result<()> {
    let len = header.len() + data.len();
    let padded = len.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    let mut buf = AlignedBuf::zeroed(padded);
    buf.as_mut()[..header.len()].copy_from_slice(header);
    buf.as_mut()[header.len()..len].copy_from_slice(data);
    let written = staged(path, libc::O_DIRECT, &mut |file| {
        file.write_all(buf.as_ref())?;
        file.set_len(len as u64)
    });
    match written {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => put(path, &[header, data]),
        other => other,
    }
}

/// Creates a staging file `NAME#N` beside `path` (with `flags` added to its open), lets
/// `write` fill it, and renames it to `path`; on an error the staging file is removed.
fn staged(
    path: &Path,
    flags: i32,
    write: &mut dyn FnMut(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "object name"))?;
    let mut made_dir = false;
    loop {
        let n = NEXT_STAGING.fetch_add(1, Ordering::Relaxed);
        let staging = path.with_file_name(format!("{name}#{n}"));
        let mut file = match File::options()
            .write(true)
            .create_new(true)
            .custom_flags(flags)
            .open(&staging)
        {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound && !made_dir => {
                let dir = path.parent().expect("an object lives in a directory");
                std::fs::create_dir_all(dir)?;
                made_dir = true;
                continue;
            }
            Err(e) => return Err(e),
        };
        let written = write(&mut file).and_then(|()| {
            drop(file);
            std::fs::rename(&staging, path)
        });
        if written.is_err() {
            let _ = std::fs::remove_file(&staging);
        }
        return written;
    }
}

/// A zeroed buffer aligned to [`DIRECT_ALIGN`].
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn zeroed(len: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len.max(DIRECT_ALIGN), DIRECT_ALIGN)
            .expect("a valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, layout }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` owns `layout.size()` initialized (zeroed) bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }

    fn as_ref(&self) -> &[u8] {
        // SAFETY: as in `as_mut`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

// SAFETY: the buffer is owned memory, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}

/// The bytes of each of `ranges` of the object `path`. An object shorter than a range is
/// `UnexpectedEof`; a missing one `NotFound`.
pub fn read_ranges(path: &Path, ranges: &[Range<u64>]) -> io::Result<Vec<Bytes>> {
    let file = File::open(path)?;
    ranges
        .iter()
        .map(|range| {
            let mut buf = BytesMut::zeroed((range.end - range.start) as usize);
            file.read_exact_at(&mut buf, range.start)?;
            Ok(buf.freeze())
        })
        .collect()
}

/// A staging file left behind: a write that never reached its rename (the process died in
/// the middle). Nothing names it; `object_store` does not list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    pub path: std::path::PathBuf,
    pub len: u64,
    /// When it was last written, in ms since the epoch.
    pub modified_ms: i64,
}

/// Whether `name` is a staging name, `NAME#N`.
fn is_staging(name: &str) -> bool {
    name.split_once('#')
        .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The staging files under `chunks` (its `HH` directories), as [`put`] leaves them when it
/// dies before the rename.
pub fn unfinished(chunks: &Path) -> io::Result<Vec<Unfinished>> {
    let mut out = Vec::new();
    let dirs = match std::fs::read_dir(chunks) {
        Ok(dirs) => dirs,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for dir in dirs {
        let dir = dir?;
        if !dir.file_type()?.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(dir.path())? {
            let entry = entry?;
            if !entry.file_name().to_str().is_some_and(is_staging) {
                continue;
            }
            let meta = entry.metadata()?;
            let modified_ms = meta
                .modified()?
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            out.push(Unfinished {
                path: entry.path(),
                len: meta.len(),
                modified_ms,
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The length of the object `path`.
pub fn len(path: &Path) -> io::Result<u64> {
    Ok(std::fs::metadata(path)?.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfinished_writes_are_found_and_objects_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let chunks = dir.path().join("chunks");
        put(&chunks.join("07/0000000000000007-0000"), &[b"whole"]).unwrap();
        std::fs::write(chunks.join("07/0000000000000008-0000#12"), b"half").unwrap();
        std::fs::write(chunks.join("07/0000000000000009-0000#x"), b"not ours").unwrap();
        let found = unfinished(&chunks).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, chunks.join("07/0000000000000008-0000#12"));
        assert_eq!(found[0].len, 4);
        assert!(unfinished(&dir.path().join("none")).unwrap().is_empty());
    }

    #[test]
    fn a_direct_put_is_cut_to_its_length_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chunks/09/0000000000000009-0001");
        let header = vec![7u8; 276];
        let data: Vec<u8> = (0..(1 << 20) + 123).map(|i| (i % 251) as u8).collect();
        put_direct(&path, &header, &data).unwrap();
        assert_eq!(len(&path).unwrap(), (header.len() + data.len()) as u64);
        let got = read_ranges(&path, &[0..276, 276..276 + data.len() as u64]).unwrap();
        assert_eq!(&got[0][..], &header[..]);
        assert_eq!(&got[1][..], &data[..]);
        let names = std::fs::read_dir(path.parent().unwrap()).unwrap().count();
        assert_eq!(names, 1, "nothing staged is left");
    }

    #[test]
    fn put_stages_then_renames_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chunks/07/0000000000000007-0000");
        put(&path, &[b"head", b"data bytes"]).unwrap();
        let names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["0000000000000007-0000".to_string()]);
        let got = read_ranges(&path, &[0..4, 4..14]).unwrap();
        assert_eq!(&got[0][..], b"head");
        assert_eq!(&got[1][..], b"data bytes");
        let short = read_ranges(&path, &[0..4, 10..20]).unwrap_err();
        assert_eq!(short.kind(), io::ErrorKind::UnexpectedEof);
        let gone = read_ranges(&dir.path().join("nothing"), &[0..1, 1..2]).unwrap_err();
        assert_eq!(gone.kind(), io::ErrorKind::NotFound);
    }
}
