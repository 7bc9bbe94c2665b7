//! The llava family plugin (in progress).
