//! # keyed-rng
//!
//! (Being written: the workspace's one keyed random generator.)
#![deny(missing_docs)]
