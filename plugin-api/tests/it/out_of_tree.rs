//! Builds the out-of-tree plugin from docs/writing-a-plugin.md and loads it.
