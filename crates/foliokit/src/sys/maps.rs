//! Mapping lines of `/proc/PID/maps`, which smaps also heads each mapping
//! with: parsed here once for every reader (the lazy fill's checks,
//! relocation's attributes, the process mover's list, smaps' fields).

/// One mapping as `/proc/PID/maps` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapLine {
    pub start: usize,
    pub end: usize,
    /// `rw-p` and the like.
    pub perms: String,
    pub inode: u64,
    /// The path or `[name]`, empty if none; its words joined by one space
    /// (a ` (deleted)` suffix kept).
    pub path: String,
}

impl MapLine {
    /// Parses one line; `None` for a line that is not a mapping's (an
    /// smaps field such as `Rss:`).
    pub fn parse(line: &str) -> Option<MapLine> {
        let mut f = line.split_whitespace();
        let (a, b) = f.next()?.split_once('-')?;
        let start = usize::from_str_radix(a, 16).ok()?;
        let end = usize::from_str_radix(b, 16).ok()?;
        let perms = f.next()?.to_owned();
        let _offset = f.next()?;
        let _dev = f.next()?;
        let inode = f.next()?.parse().ok()?;
        let path = f.collect::<Vec<_>>().join(" ");
        Some(MapLine {
            start,
            end,
            perms,
            inode,
            path,
        })
    }

    /// Whether the mapping overlaps `[start, end)`.
    pub fn overlaps(&self, start: usize, end: usize) -> bool {
        self.start < end && self.end > start
    }

    pub fn private(&self) -> bool {
        self.perms.ends_with('p')
    }

    /// Anonymous memory: no file behind it (the heap included).
    pub fn anon(&self) -> bool {
        self.inode == 0 && (self.path.is_empty() || self.path == "[heap]")
    }

    /// The `PROT_*` bits of the mapping's permissions.
    pub fn prot(&self) -> libc::c_int {
        let b = self.perms.as_bytes();
        let mut p = libc::PROT_NONE;
        if b.first() == Some(&b'r') {
            p |= libc::PROT_READ;
        }
        if b.get(1) == Some(&b'w') {
            p |= libc::PROT_WRITE;
        }
        if b.get(2) == Some(&b'x') {
            p |= libc::PROT_EXEC;
        }
        p
    }
}

/// Every mapping line of `text` (maps or smaps), in order.
pub fn parse(text: &str) -> Vec<MapLine> {
    text.lines().filter_map(MapLine::parse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mapping_lines_and_skips_smaps_fields() {
        let text = "\
7f00-8000 rw-p 00000000 00:00 0 \n\
Rss:                 8 kB\n\
VmFlags: rd wr mr mw me ac\n\
8000-9000 r--s 00001000 fd:01 1234   /tmp/a file (deleted)\n\
9000-a000 rw-p 00000000 00:00 0                          [heap]\n\
zz-yy rw-p 0 0 0\n";
        let m = parse(text);
        assert_eq!(m.len(), 3);
        assert_eq!(
            (m[0].start, m[0].end, m[0].path.as_str()),
            (0x7f00, 0x8000, "")
        );
        assert!(m[0].private() && m[0].anon());
        assert_eq!(m[1].inode, 1234);
        assert_eq!(m[1].path, "/tmp/a file (deleted)");
        assert!(!m[1].private() && !m[1].anon());
        assert!(m[2].anon());
        assert!(m[1].overlaps(0x8fff, 0x9000) && !m[1].overlaps(0x9000, 0x9800));
    }
}
