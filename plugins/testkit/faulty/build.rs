//! The Qwen2-VL crate this fixture wraps exports its own plugin symbols (`export_plugin!`), and
//! its rlib is linked in; the fixture's own definitions come first on the link line, so the
//! linker is told to keep the first of each and the library is `testkit-faulty`.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,--allow-multiple-definition");
}
