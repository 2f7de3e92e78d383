//! Shared by the protocol tests: building bytes field by field, in native
//! byte order, independently of the crate's own structs.
#![allow(dead_code)]

/// Bytes pushed field by field in native byte order.
#[derive(Clone, Debug, Default)]
pub struct W(pub Vec<u8>);

impl W {
    pub fn new() -> Self {
        W(Vec::new())
    }
    pub fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    /// A name and its terminating NUL.
    pub fn name(mut self, s: &str) -> Self {
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        self
    }
    pub fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn zeros(mut self, n: usize) -> Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    /// Zeros up to `total` bytes.
    pub fn pad_to(mut self, total: usize) -> Self {
        assert!(
            total >= self.0.len(),
            "test bug: body longer than its padded size"
        );
        self.0.resize(total, 0);
        self
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn cut(mut self, n: usize) -> Self {
        self.0.truncate(n);
        self
    }
    /// A name and its NUL (the same as [`W::name`]).
    pub fn cstr(self, s: &str) -> Self {
        self.name(s)
    }
    /// Zero padding to the next multiple of 8.
    pub fn pad8(mut self) -> Self {
        while !self.0.len().is_multiple_of(8) {
            self.0.push(0);
        }
        self
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn done(self) -> Vec<u8> {
        self.0
    }
}
