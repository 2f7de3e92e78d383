//! Protocol extensions that are not part of the upstream kernel ABI.
//! Each is opt-in and never decoded by default.

pub mod atomic_open;
