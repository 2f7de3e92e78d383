//! Mounting, the INIT handshake and a multi-threaded session loop over
//! `/dev/fuse`, dispatching to a pluggable [`Filesystem`].
pub mod mount;
pub mod transport;
