//! Fault injection at the storage seam: [`FaultStore`] wraps any backend and makes the N-th
//! write operation (put, delete or commit) from now fail with an I/O error, as a full disk or
//! a dying device would, or makes every write of a given value panic, as a bug in the code
//! that writes it would. Tests use it to show that a failed operation leaves no partial state.

use calm_types::sync::Locked;
use std::borrow::Cow;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use calm_store::{LogVisitor, ReadTxn, Result, Store, StoreError, Visitor, WriteTxn};

/// Countdown value meaning "never fail".
const NEVER: u64 = u64::MAX;

/// A backend wrapper that fails on command.
#[derive(Debug)]
pub struct FaultStore<S> {
    inner: S,
    /// Write operations left before the injected failure; [`NEVER`] disables it.
    countdown: AtomicU64,
    /// A write of a value (or log record) containing these bytes panics.
    panic_on: Mutex<Option<Vec<u8>>>,
}

impl<S: Store> FaultStore<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            countdown: AtomicU64::new(NEVER),
            panic_on: Mutex::new(None),
        }
    }

    /// Every write from now of a value or log record that contains `needle` panics (until
    /// [`FaultStore::heal`]).
    pub fn panic_on_value(&self, needle: &[u8]) {
        *self.panic_on.locked() = Some(needle.to_vec());
    }

    /// The `n`-th write operation from now (0 = the next one) fails, once.
    pub fn fail_after(&self, n: u64) {
        self.countdown.store(n, Ordering::SeqCst);
    }

    /// Cancels a pending failure and the panics.
    pub fn heal(&self) {
        self.countdown.store(NEVER, Ordering::SeqCst);
        *self.panic_on.locked() = None;
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }
}

/// Counts one write operation down; fails when the countdown reaches zero.
fn tick(countdown: &AtomicU64) -> Result<()> {
    let step = countdown.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| match left {
        NEVER => None,
        0 => Some(NEVER),
        n => Some(n - 1),
    });
    match step {
        Ok(0) => Err(StoreError::Io("injected fault".into())),
        _ => Ok(()),
    }
}

/// A write transaction of a [`FaultStore`].
#[derive(Debug)]
pub struct FaultTxn<'s, T> {
    inner: T,
    countdown: &'s AtomicU64,
    panic_on: Option<Vec<u8>>,
}

impl<T> FaultTxn<'_, T> {
    /// Panics when `value` holds the bytes writes of which are to panic.
    fn check(&self, value: &[u8]) {
        if let Some(needle) = &self.panic_on
            && value.windows(needle.len().max(1)).any(|w| w == &needle[..])
        {
            panic!("injected panic: a write of {} bytes", value.len());
        }
    }
}

impl<T: ReadTxn> ReadTxn for FaultTxn<'_, T> {
    fn get(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>> {
        self.inner.get(key)
    }

    fn visit(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<usize> {
        self.inner.visit(start, end, visit)
    }

    fn last_in(&self, start: &[u8], end: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.inner.last_in(start, end)
    }

    fn log_visit(&self, from: u64, visit: &mut LogVisitor<'_>) -> Result<usize> {
        self.inner.log_visit(from, visit)
    }

    fn log_first(&self) -> Result<Option<u64>> {
        self.inner.log_first()
    }

    fn log_last(&self) -> Result<Option<u64>> {
        self.inner.log_last()
    }
}

impl<T: WriteTxn> WriteTxn for FaultTxn<'_, T> {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.check(value);
        tick(self.countdown)?;
        self.inner.put(key, value)
    }

    fn append(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.check(value);
        tick(self.countdown)?;
        self.inner.append(key, value)
    }

    fn delete(&mut self, key: &[u8]) -> Result<bool> {
        tick(self.countdown)?;
        self.inner.delete(key)
    }

    fn log_append(&mut self, index: u64, record: &[u8]) -> Result<()> {
        self.check(record);
        tick(self.countdown)?;
        self.inner.log_append(index, record)
    }

    fn log_purge(&mut self, from: u64, upto: u64) -> Result<()> {
        tick(self.countdown)?;
        self.inner.log_purge(from, upto)
    }

    fn commit(self) -> Result<()> {
        tick(self.countdown)?;
        self.inner.commit()
    }
}

impl<S: Store> Store for FaultStore<S> {
    type Snapshot<'s> = S::Snapshot<'s>;
    type Txn<'s> = FaultTxn<'s, S::Txn<'s>>;

    fn snapshot(&self) -> Result<Self::Snapshot<'_>> {
        self.inner.snapshot()
    }

    fn begin(&self) -> Result<Self::Txn<'_>> {
        Ok(FaultTxn {
            inner: self.inner.begin()?,
            countdown: &self.countdown,
            panic_on: self.panic_on.locked().clone(),
        })
    }

    fn size_bytes(&self) -> Result<u64> {
        self.inner.size_bytes()
    }
}
