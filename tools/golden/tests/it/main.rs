//! Integration tests: every committed oracle fixture loads and is internally consistent.

mod fixtures;
