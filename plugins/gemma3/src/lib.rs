//! The gemma3 family plugin (in progress).
