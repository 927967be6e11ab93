//! What the unit tests of several areas share.

/// Private anonymous memory, unmapped on drop.
pub(crate) struct Map(pub *mut u8, pub usize);

impl Map {
    pub(crate) fn new(len: usize) -> Map {
        // SAFETY: a fresh anonymous mapping; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Map(p.cast(), len)
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.0.cast(), self.1) };
    }
}
