//! One thread at a time uses IREE in this process. Devices made on two
//! threads at once corrupted each other ("ref type mismatch" inside
//! `hal.executable.lookup.function`, and a SIGSEGV) even with one shared VM
//! instance, and two compiler sessions at once crashed: the production shape
//! is one engine thread owning the runtime anyway. The lock is re-entrant
//! per thread: a thread holding a device may create more and may compile.

use std::{
    marker::PhantomData,
    sync::{Condvar, Mutex},
    thread::ThreadId,
};

static OWNER: Mutex<(Option<ThreadId>, usize)> = Mutex::new((None, 0));
static FREED: Condvar = Condvar::new();

/// Held while a thread uses IREE; not `Send`, released on drop.
#[derive(Debug)]
pub(crate) struct IreeLock {
    _not_send: PhantomData<*const ()>,
}

impl IreeLock {
    /// Waits until no other thread holds the lock, then holds it.
    pub(crate) fn acquire() -> Self {
        let me = std::thread::current().id();
        let mut state = OWNER.lock().unwrap_or_else(|p| p.into_inner());
        while state.0.is_some_and(|owner| owner != me) {
            state = FREED.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        state.0 = Some(me);
        state.1 += 1;
        IreeLock { _not_send: PhantomData }
    }
}

impl Drop for IreeLock {
    fn drop(&mut self) {
        let mut state = OWNER.lock().unwrap_or_else(|p| p.into_inner());
        state.1 -= 1;
        if state.1 == 0 {
            state.0 = None;
            FREED.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_is_reentrant_and_exclusive_across_threads() {
        let outer = IreeLock::acquire();
        let inner = IreeLock::acquire();
        let (tx, rx) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            let _held = IreeLock::acquire();
            tx.send(()).expect("send");
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "another thread waits while this one holds the lock");
        drop(inner);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "still held once");
        drop(outer);
        other.join().expect("join");
        assert!(rx.try_recv().is_ok());
    }
}
