//! The mappings of a range as /proc/self/smaps shows them: each maps line
//! with its VmFlags.

use crate::sys::maps::MapLine;

/// One mapping as smaps shows it: its maps line and its VmFlags.
#[derive(Debug, Clone)]
pub struct Vma {
    pub map: MapLine,
    /// Two-letter VmFlags (`rd wr mr … hg`).
    pub flags: Vec<String>,
}

impl std::ops::Deref for Vma {
    type Target = MapLine;

    fn deref(&self) -> &MapLine {
        &self.map
    }
}

impl Vma {
    pub fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
}

pub(crate) fn parse(text: &str) -> Vec<Vma> {
    let mut out: Vec<Vma> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("VmFlags:") {
            if let Some(v) = out.last_mut() {
                v.flags = rest.split_whitespace().map(str::to_owned).collect();
            }
        } else if let Some(m) = MapLine::parse(line) {
            out.push(Vma {
                map: m,
                flags: Vec::new(),
            });
        }
    }
    out
}

/// The mappings overlapping `[addr, addr + len)`.
pub fn overlapping(addr: usize, len: usize) -> std::io::Result<Vec<Vma>> {
    let text = std::fs::read_to_string("/proc/self/smaps")?;
    let end = addr + len;
    Ok(parse(&text)
        .into_iter()
        .filter(|v| v.end > addr && v.start < end)
        .collect())
}

/// Whether a mapping over `[addr, addr + len)` is wipe-on-fork (a child
/// must read zeros there, never the parent's bytes); `true` where smaps
/// cannot be read, the safe answer.
pub fn wipes_on_fork(addr: usize, len: usize) -> bool {
    overlapping(addr, len).map_or(true, |vs| vs.iter().any(|v| v.has("wf")))
}
