//! Writing the record log's recent records to their segment files at a checkpoint, each run
//! of contiguous records with one write per file, and syncing every file touched at once.

use std::path::Path;
use std::sync::Arc;

use calm_types::sync::{Locked, RwLocked};

use super::{Bounds, Chunk, RecordLog, Segment, Writer, entry, io, open_segment, segment_name};
use crate::Result;
use crate::disk::DiskFile;

impl RecordLog {
    /// For a checkpoint: writes the records appended since the last one to the segment files
    /// and makes them durable; returns the bounds to record in the checkpoint slot. Called by
    /// the writer with no commit in progress.
    pub fn sync(&self) -> Result<Bounds> {
        let mut writer = self.writer.locked();
        let (bounds, recent) = {
            let state = self.state.read_locked();
            (state.bounds, state.recent.clone())
        };
        // (A read-only log never has recent records: nothing below writes then.)
        let (created, touched) = self.write_recent(&mut writer, bounds, &recent)?;
        self.sync_files(&touched)?;
        if !created.is_empty() || writer.dir_dirty {
            if let Some(dir) = &self.dir_file {
                dir.sync_all().map_err(|e| io("syncing", &self.dir, e))?;
            }
            writer.dir_dirty = false;
        }
        let mut state = self.state.write_locked();
        for (number, segment) in created {
            state.segments.insert(number, segment);
        }
        state.flushed = bounds.last;
        state.recent.retain(|chunk| chunk.last() > bounds.last);
        Ok(bounds)
    }

    /// Writes the records of `recent` to their segments' files, each run of contiguous ones
    /// with one write per file: the segments made for them, and every segment written.
    #[allow(clippy::type_complexity)]
    fn write_recent(
        &self,
        writer: &mut Writer,
        bounds: Bounds,
        recent: &[Arc<Chunk>],
    ) -> Result<(Vec<(u64, Arc<Segment>)>, Vec<(u64, Arc<Segment>)>)> {
        let mut created: Vec<(u64, Arc<Segment>)> = Vec::new();
        let mut touched: Vec<(u64, Arc<Segment>)> = Vec::new();
        let mut run: Option<Run> = None;
        // Records of segments a purge removed wholly are not written (the files are gone or
        // going); the others are, purged or not, so that the last index's record is always in
        // its segment's file (where an open finds the end of the file).
        let first_kept = bounds.first / self.segment_records * self.segment_records;
        for chunk in recent {
            for index in chunk.first.max(first_kept)..=chunk.last() {
                let number = index / self.segment_records;
                let slot = index % self.segment_records;
                let start = match writer.tail {
                    Some((n, end)) if n == number => end,
                    _ => 0,
                };
                let contiguous = run.as_ref().is_some_and(|run| {
                    run.number == number
                        && run.rec_at + run.rec.len() as u64 == start
                        && run.idx_at + run.idx.len() as u64 == slot * 8
                });
                if !contiguous {
                    if let Some(done) = run.take() {
                        done.write(&self.dir)?;
                    }
                    let segment = self.segment_for(writer, number, &mut touched, &mut created)?;
                    run = Some(Run {
                        number,
                        segment,
                        rec_at: start,
                        rec: Vec::new(),
                        idx_at: slot * 8,
                        idx: Vec::new(),
                    });
                }
                let record = chunk.record(index);
                let run = run.as_mut().expect("a run");
                run.rec.extend_from_slice(record);
                run.idx
                    .extend_from_slice(&entry(start, record.len() as u64).to_le_bytes());
                writer.tail = Some((number, start + record.len() as u64));
            }
        }
        if let Some(done) = run.take() {
            done.write(&self.dir)?;
        }
        Ok((created, touched))
    }

    /// Segment `number` to write into: one this sync touched already, one the log knows, a
    /// spare file reused, or a new one (the last two noted in `created`).
    fn segment_for(
        &self,
        writer: &mut Writer,
        number: u64,
        touched: &mut Vec<(u64, Arc<Segment>)>,
        created: &mut Vec<(u64, Arc<Segment>)>,
    ) -> Result<Arc<Segment>> {
        if let Some((_, segment)) = touched.iter().find(|(n, _)| *n == number) {
            return Ok(segment.clone());
        }
        let known = self.state.read_locked().segments.get(&number).cloned();
        let segment = match known {
            Some(segment) => segment,
            None => {
                let segment = match writer.reuse(&self.dir, number)? {
                    Some(spare) => spare,
                    None => Arc::new(open_segment(&self.dir, number, true)?),
                };
                created.push((number, segment.clone()));
                segment
            }
        };
        touched.push((number, segment.clone()));
        Ok(segment)
    }

    /// Syncs every file of the `touched` segments at once (a thread each but the last): the
    /// syncs wait on the device side by side instead of one after the other.
    fn sync_files(&self, touched: &[(u64, Arc<Segment>)]) -> Result<()> {
        let files: Vec<(&DiskFile, u64, &str)> = touched
            .iter()
            .flat_map(|(number, segment)| {
                [
                    (&segment.rec, *number, "rec"),
                    (&segment.idx, *number, "idx"),
                ]
            })
            .collect();
        let sync = |(file, number, ext): (&DiskFile, u64, &str)| {
            let path = self.dir.join(segment_name(number, ext));
            file.sync_data().map_err(|e| io("syncing", &path, e))
        };
        std::thread::scope(|scope| {
            let mut files = files.into_iter();
            let last = files.next_back();
            let others: Vec<_> = files.map(|f| scope.spawn(move || sync(f))).collect();
            let mut outcome = last.map_or(Ok(()), sync);
            for other in others {
                let synced = other.join().expect("a record file's sync panicked");
                outcome = outcome.and(synced);
            }
            outcome
        })
    }
}

/// Records appended to one segment back to back, written with one write per file.
struct Run {
    number: u64,
    segment: Arc<Segment>,
    rec_at: u64,
    rec: Vec<u8>,
    idx_at: u64,
    idx: Vec<u8>,
}

impl Run {
    fn write(self, dir: &Path) -> Result<()> {
        let path = dir.join(segment_name(self.number, "rec"));
        self.segment
            .rec
            .write_all_at(&self.rec, self.rec_at)
            .map_err(|e| io("writing", &path, e))?;
        let path = dir.join(segment_name(self.number, "idx"));
        self.segment
            .idx
            .write_all_at(&self.idx, self.idx_at)
            .map_err(|e| io("writing", &path, e))
    }
}
