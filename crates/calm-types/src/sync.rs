//! The one way calm takes a mutex: a panic while another thread held it does not poison it for
//! everyone after. The state a lock guards is kept consistent by its holder's code, not by
//! unwinding; a request that panicked fails alone, and every later request is served.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, also when a thread panicked while holding it.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
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
        *lock(&mutex) += 1;
        assert_eq!(*lock(&mutex), 3);
    }
}
