//! Unit tests for manifest parsing and validation.
