//! flowrl
