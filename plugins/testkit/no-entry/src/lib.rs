//! plugin-api test fixture: a valid shared library without the plugin symbols (the loader
//! must report the missing symbol and skip it).

#![forbid(unsafe_code)]

/// Something for the library to contain.
pub fn answer() -> u32 {
    42
}
