//! The only crate in ember with `unsafe` code and raw syscalls. Every other crate
//! is `#![forbid(unsafe_code)]` and calls the safe functions here.
//!
//! Every `unsafe` block carries a `SAFETY:` comment naming the invariant it relies on.

pub mod process;
