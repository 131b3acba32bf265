//! The one way calm takes a mutex: a panic while another thread held it does not poison it for
//! everyone after. The state a lock guards is kept consistent by its holder's code, not by
//! unwinding; a request that panicked fails alone, and every later request is served.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`] without poisoning.
pub trait Locked<T: ?Sized> {
    /// Locks the mutex, also when a thread panicked while holding it.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`] without poisoning.
pub trait RwLocked<T: ?Sized> {
    /// Shares the lock, also when a thread panicked while it wrote.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// Takes the lock, also when a thread panicked while it held it.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLocked<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutex_held_by_a_thread_that_panicked_still_locks() {
        let mutex = std::sync::Arc::new(Mutex::new(1));
        let held = mutex.clone();
        let panicked = std::thread::spawn(move || {
            let mut guard = held.lock().unwrap();
            *guard = 2;
            panic!("a request failed while holding the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(mutex.is_poisoned());
        *mutex.locked() += 1;
        assert_eq!(*mutex.locked(), 3);
    }
}
