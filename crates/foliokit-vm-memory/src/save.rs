//! Writing a snapshot (format in `snapshot.rs`): every region read with
//! machine-check-safe copies, its all-zero pages counted, and left as
//! holes where the output is a file.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use foliokit::{CopyStrategy, McError};
use vm_memory::bitmap::Bitmap;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::snapshot::{
    bad_format, kind_code, mc_unavailable, round_up, Layout, CHUNK, MAX_REGIONS, TRAILER_MAGIC,
};
use crate::{io_err, push_bad, region_host, BadRange, Result};

/// Where a snapshot's bytes go: data, or a run of zeros (which a file
/// leaves as a hole).
trait Sink {
    fn data(&mut self, b: &[u8]) -> std::io::Result<()>;
    fn zeros(&mut self, n: usize) -> std::io::Result<()>;
    fn finish(&mut self) -> std::io::Result<()>;
}

/// Any `Write`: zeros are written as bytes.
struct Stream<'w, W: Write + ?Sized>(&'w mut W);

impl<W: Write + ?Sized> Sink for Stream<'_, W> {
    fn data(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.0.write_all(b)
    }
    fn zeros(&mut self, mut n: usize) -> std::io::Result<()> {
        const Z: [u8; 4096] = [0; 4096];
        while n > 0 {
            let k = n.min(Z.len());
            self.0.write_all(&Z[..k])?;
            n -= k;
        }
        Ok(())
    }
    fn finish(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// A new, empty file: data is written at its offset in `CHUNK`-sized
/// writes, zeros are skipped (a hole), and the length set at the end (a
/// trailing run of zeros is a hole too).
struct Sparse<'f> {
    file: &'f File,
    buf: Vec<u8>,
    /// The file offset of `buf`'s first byte.
    buf_at: u64,
}

impl Sparse<'_> {
    fn flush_buf(&mut self) -> std::io::Result<()> {
        self.file.write_all_at(&self.buf, self.buf_at)?;
        self.buf_at += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

impl Sink for Sparse<'_> {
    fn data(&mut self, b: &[u8]) -> std::io::Result<()> {
        if self.buf.len() + b.len() > CHUNK {
            self.flush_buf()?;
        }
        if b.len() >= CHUNK {
            self.file.write_all_at(b, self.buf_at)?;
            self.buf_at += b.len() as u64;
        } else {
            self.buf.extend_from_slice(b);
        }
        Ok(())
    }
    fn zeros(&mut self, n: usize) -> std::io::Result<()> {
        self.flush_buf()?;
        self.buf_at += n as u64;
        Ok(())
    }
    fn finish(&mut self) -> std::io::Result<()> {
        self.flush_buf()?;
        self.file.set_len(self.buf_at)
    }
}

/// Whether every byte of `b` is zero.
fn all_zero(b: &[u8]) -> bool {
    // SAFETY: any bytes are a valid u128.
    let (head, mid, tail) = unsafe { b.align_to::<u128>() };
    head.iter().all(|&x| x == 0)
        && tail.iter().all(|&x| x == 0)
        && mid.chunks(16).all(|c| c.iter().fold(0, |a, &x| a | x) == 0)
}

/// Hands `buf` to `sink` page by page from its start: runs of whole pages
/// that are all zero as zeros, the rest as data. Returns the zero pages.
fn put_pages(sink: &mut dyn Sink, buf: &[u8], page: usize) -> std::io::Result<u64> {
    let mut zero_pages = 0;
    let mut at = 0;
    while at < buf.len() {
        let zero = |i: usize| i + page <= buf.len() && all_zero(&buf[i..i + page]);
        let z = zero(at);
        let mut end = at + page.min(buf.len() - at);
        while end < buf.len() && zero(end) == z {
            end += page.min(buf.len() - end);
        }
        if z {
            zero_pages += ((end - at) / page) as u64;
            sink.zeros(end - at)?;
        } else {
            sink.data(&buf[at..end])?;
        }
        at = end;
    }
    Ok(zero_pages)
}

/// What [`snapshot`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotReport {
    /// Bytes written to the output, header and trailer included.
    pub bytes_written: u64,
    /// Guest bytes saved (the sum of the region lengths).
    pub guest_bytes: u64,
    /// Guest pages (base pages) that were all zero. [`snapshot_to_file`]
    /// leaves them as holes in the file: a restore neither reads nor
    /// copies them.
    pub zero_pages: u64,
    /// Guest ranges that raised SIGBUS while read; saved as zeros and
    /// listed in the snapshot's trailer.
    pub bad: Vec<BadRange>,
    /// The machine-check-safe copy strategy that ran last (`None`: no
    /// copy ran).
    pub strategy: Option<CopyStrategy>,
    /// Wall time, in seconds.
    pub secs: f64,
}

/// Writes every region of `mem` to `out` as a snapshot (format in the
/// module docs), reading guest RAM with machine-check-safe copies.
///
/// A guest page that raises SIGBUS while it is read (hardware poison, a
/// memory file truncated under the VMM) is saved as zeros, listed in the
/// snapshot's trailer and in the report; the rest is saved. Pause the vCPUs
/// first for a consistent image: running vCPUs are allowed (no undefined
/// behaviour, no reference is formed over guest RAM), but the bytes saved
/// are then some interleaving of old and new values. Output errors stop the
/// snapshot with [`Error::Io`].
pub fn snapshot<B: Bitmap, W: Write + ?Sized>(
    mem: &GuestMemoryMmap<B>,
    out: &mut W,
) -> Result<SnapshotReport> {
    save(mem, &mut Stream(out))
}

fn save<B: Bitmap>(mem: &GuestMemoryMmap<B>, out: &mut dyn Sink) -> Result<SnapshotReport> {
    let t0 = Instant::now();
    let page = foliokit::batch::page_size();
    let regions: Vec<(u64, u64)> = mem.iter().map(|r| (r.start_addr().0, r.len())).collect();
    // Restore refuses more regions than this; refuse to write such a file.
    if regions.len() as u64 > MAX_REGIONS {
        return Err(bad_format(format!(
            "{} guest regions, at most {MAX_REGIONS} fit a snapshot",
            regions.len()
        )));
    }
    let layout = Layout::new(page as u64, &regions)
        .ok_or_else(|| bad_format("guest memory too large to describe"))?;
    let header = layout.header();
    out.data(&header)
        .map_err(io_err("writing the snapshot header"))?;
    let mut written = header.len() as u64;
    let mut bad = Vec::new();
    let mut strategy = None;
    let mut zero_pages = 0;
    let mut buf = vec![0u8; CHUNK];
    for (region, &(g, l, _)) in mem.iter().zip(&layout.regions) {
        let host = region_host(region);
        let len = l as usize;
        let mut pos = 0;
        while pos < len {
            let n = CHUNK.min(len - pos);
            let chunk = host.wrapping_add(pos);
            let mut k = 0;
            while k < n {
                // SAFETY: `chunk + k .. chunk + n` lies inside the region's
                // live host mapping (borrowed through `mem`), read only with
                // the mc routine, which reports a SIGBUS instead of dying
                // and tolerates concurrent vCPU writes; `buf` is our own
                // buffer of CHUNK >= n bytes, disjoint from guest RAM.
                let r = unsafe {
                    foliokit::copy_mc_raw(
                        buf.as_mut_ptr().add(k),
                        chunk.wrapping_add(k),
                        n - k,
                        CopyStrategy::Auto,
                    )
                };
                match r {
                    Ok(s) => {
                        strategy = Some(s);
                        k = n;
                    }
                    Err(McError::Fault(f)) => {
                        let stop = n - f.not_copied;
                        let fault_addr = chunk as usize + stop;
                        let next = (fault_addr / page + 1) * page;
                        let end = (next - chunk as usize).min(n);
                        buf[stop..end].fill(0);
                        push_bad(
                            &mut bad,
                            g + (pos + stop) as u64,
                            (end - stop) as u64,
                            f.kind,
                        );
                        k = end;
                    }
                    Err(e) => return Err(mc_unavailable(e)),
                }
            }
            // Read anyway: finding its zero pages costs no second read.
            zero_pages +=
                put_pages(out, &buf[..n], page).map_err(io_err("writing the snapshot"))?;
            written += n as u64;
            pos += n;
        }
        let pad = (round_up(l, page as u64).unwrap_or(l) - l) as usize;
        out.zeros(pad).map_err(io_err("writing the snapshot"))?;
        written += pad as u64;
    }
    let mut trailer = Vec::with_capacity(16 + bad.len() * 24);
    trailer.extend_from_slice(TRAILER_MAGIC);
    trailer.extend_from_slice(&(bad.len() as u64).to_le_bytes());
    for b in &bad {
        for v in [b.addr.0, b.len, kind_code(b.kind)] {
            trailer.extend_from_slice(&v.to_le_bytes());
        }
    }
    out.data(&trailer)
        .map_err(io_err("writing the snapshot trailer"))?;
    out.finish().map_err(io_err("flushing the snapshot"))?;
    written += trailer.len() as u64;
    Ok(SnapshotReport {
        bytes_written: written,
        guest_bytes: regions.iter().map(|r| r.1).sum(),
        zero_pages,
        bad,
        strategy,
        secs: t0.elapsed().as_secs_f64(),
    })
}

/// [`snapshot`] into a new file at `path` (created or truncated), synced to
/// disk before returning. Guest pages that are all zero are left as holes
/// (the file is sparse; its length is the snapshot's): they take no disk
/// space, and [`crate::restore_from_file`] and [`crate::restore_lazy`]
/// neither read nor copy them.
pub fn snapshot_to_file<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    path: impl AsRef<Path>,
) -> Result<SnapshotReport> {
    let file = File::create(path).map_err(io_err("creating the snapshot file"))?;
    let mut w = Sparse {
        file: &file,
        buf: Vec::with_capacity(CHUNK),
        buf_at: 0,
    };
    let r = save(mem, &mut w)?;
    file.sync_all()
        .map_err(io_err("syncing the snapshot file"))?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Log(Vec<(bool, usize)>);
    impl Sink for Log {
        fn data(&mut self, b: &[u8]) -> std::io::Result<()> {
            self.0.push((false, b.len()));
            Ok(())
        }
        fn zeros(&mut self, n: usize) -> std::io::Result<()> {
            self.0.push((true, n));
            Ok(())
        }
        fn finish(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn zero_pages_are_found_in_runs_and_a_short_tail_is_data() {
        let mut b = vec![0u8; 10 * 64 + 5];
        b[64 + 63] = 1; // page 1
        b[4 * 64] = 1; // page 4
        b[9 * 64 + 1] = 7; // page 9; the 5-byte tail is zeros but short
        let mut log = Log::default();
        let z = put_pages(&mut log, &b, 64).unwrap();
        assert_eq!(z, 7);
        assert_eq!(
            log.0,
            vec![
                (true, 64),
                (false, 64),
                (true, 128),
                (false, 64),
                (true, 256),
                (false, 69)
            ]
        );
        assert!(all_zero(&[0; 100]) && !all_zero(&[0, 0, 3]) && all_zero(&[]));
    }
}
