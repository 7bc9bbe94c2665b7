//! Integration tests for plugin-api: the testkit fixture plugins loaded through the real
//! loader, every load-time refusal, version negotiation, panics, the capability gate and an
//! out-of-tree plugin built from the walkthrough in `docs/writing-a-plugin.md`.

mod gate;
mod loader;
mod out_of_tree;
mod panics;
mod support;
mod versions;
