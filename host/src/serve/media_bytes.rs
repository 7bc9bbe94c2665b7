//! The host bytes media requests hold, under one budget (`--max-media-mb`).
//!
//! A request with images or audio holds bytes from the moment its media arrives until its
//! features are merged into its prompt's rows: the encoded files, then the preprocessed
//! tensors, then the encoder's features, while it is prepared and while it waits in the
//! encoding queue. A request is admitted only if its encoded bytes fit beside what the others
//! hold; afterwards its [`Held`] follows what it actually holds (preprocessed tensors may be
//! larger than the file), and it gives everything back when it is dropped, whatever ends it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes held by every request in flight, and the most admission lets them hold.
#[derive(Debug)]
pub(crate) struct MediaBytes {
    held: AtomicU64,
    limit: u64,
}

/// One request's share of [`MediaBytes`], given back on drop.
#[derive(Debug)]
pub(crate) struct Held {
    pool: Arc<MediaBytes>,
    bytes: u64,
}

impl MediaBytes {
    pub(crate) fn new(limit: u64) -> Arc<Self> {
        Arc::new(MediaBytes { held: AtomicU64::new(0), limit })
    }

    /// Bytes held now.
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// Holds `bytes` for a new request if they fit beside what is held; `None` if not.
    pub(crate) fn reserve(self: &Arc<Self>, bytes: u64) -> Option<Held> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .ok()
            .map(|_| Held { pool: Arc::clone(self), bytes })
    }
}

impl Held {
    /// What the request holds now; counted whether or not it fits the limit (the bytes exist).
    pub(crate) fn resize(&mut self, bytes: u64) {
        if bytes >= self.bytes {
            self.pool.held.fetch_add(bytes - self.bytes, Ordering::AcqRel);
        } else {
            self.pool.held.fetch_sub(self.bytes - bytes, Ordering::AcqRel);
        }
        self.bytes = bytes;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.pool.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::MediaBytes;

    #[test]
    fn requests_are_admitted_while_their_bytes_fit_and_give_them_back_however_they_end() {
        let pool = MediaBytes::new(100);
        let mut a = pool.reserve(60).expect("fits");
        assert!(pool.reserve(41).is_none(), "101 of 100");
        let b = pool.reserve(40).expect("exactly fits");
        assert_eq!(pool.held(), 100);
        // Preprocessing made a's tensors larger than its file: counted, past the limit.
        a.resize(90);
        assert_eq!(pool.held(), 130);
        assert!(pool.reserve(1).is_none());
        drop(b);
        a.resize(10);
        assert_eq!(pool.held(), 10);
        let c = pool.reserve(90).expect("fits again");
        drop((a, c));
        assert_eq!(pool.held(), 0);
    }
}
