//! Files kept by name beside the blocks, under a directory of their own in the object store
//! (`PREFIX/DIR/NAME`): the namespace's metadata backups (`backups/`). They are uploaded from a
//! local file in parts and downloaded to one, so memory stays at a few parts whatever their
//! size; the listing of the blocks (`chunks/`) never sees them, nor `calm gc`.

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStoreExt, WriteMultipart};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::DataError;
use crate::objects::Objects;

/// Bytes of one part of an upload; two are in flight at most.
pub const PART_BYTES: usize = 8 << 20;
const PARTS_IN_FLIGHT: usize = 2;

/// A file kept by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedFile {
    pub name: String,
    pub len: u64,
    pub modified_ms: i64,
}

fn local_io(what: &str, path: &std::path::Path, error: std::io::Error) -> DataError {
    DataError::Unavailable(format!("{what} {}: {error}", path.display()))
}

impl Objects {
    fn named_path(&self, dir: &str, name: &str) -> Path {
        self.root.clone().join(dir).join(name)
    }

    /// Uploads the local file `from` as `dir/name`; the object appears whole or not at all.
    /// Returns its length.
    pub async fn put_file(
        &self,
        dir: &str,
        name: &str,
        from: &std::path::Path,
    ) -> Result<u64, DataError> {
        let mut file = tokio::fs::File::open(from)
            .await
            .map_err(|e| local_io("opening", from, e))?;
        let upload = self
            .store
            .put_multipart(&self.named_path(dir, name))
            .await?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            let n = match file.read(&mut buf).await {
                Ok(n) => n,
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(local_io("reading", from, e));
                }
            };
            if n == 0 {
                break;
            }
            if let Err(e) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
                let _ = writer.abort().await;
                return Err(e.into());
            }
            writer.write(&buf[..n]);
            total += n as u64;
        }
        writer.finish().await?;
        Ok(total)
    }

    /// The files under `dir`, by name.
    pub async fn list_files(&self, dir: &str) -> Result<Vec<NamedFile>, DataError> {
        let prefix = self.root.clone().join(dir);
        let mut stream = self.store.list(Some(&prefix));
        let mut out = Vec::new();
        while let Some(meta) = stream.next().await {
            let meta = match meta {
                Ok(meta) => meta,
                // A local store without the directory yet holds no file.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            if let Some(name) = meta.location.filename() {
                out.push(NamedFile {
                    name: name.to_string(),
                    len: meta.size,
                    modified_ms: meta.last_modified.timestamp_millis(),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Downloads `dir/name` into `file`, a new empty file the caller made (at `to`, named in
    /// errors), durable when this returns. Returns its length.
    pub async fn get_file(
        &self,
        dir: &str,
        name: &str,
        file: &mut tokio::fs::File,
        to: &std::path::Path,
    ) -> Result<u64, DataError> {
        let got = self.store.get(&self.named_path(dir, name)).await?;
        let mut stream = got.into_stream();
        let mut total = 0u64;
        while let Some(bytes) = stream.next().await {
            let bytes = bytes?;
            file.write_all(&bytes)
                .await
                .map_err(|e| local_io("writing", to, e))?;
            total += bytes.len() as u64;
        }
        file.sync_all()
            .await
            .map_err(|e| local_io("writing", to, e))?;
        Ok(total)
    }

    /// Removes `dir/name` (gone already is no error).
    pub async fn delete_file(&self, dir: &str, name: &str) -> Result<(), DataError> {
        self.check_owner().await?;
        match self.store.delete(&self.named_path(dir, name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
