pub mod base;
pub mod centralized;
pub mod ring;
pub mod sync;
pub mod tree;
pub mod worker;
