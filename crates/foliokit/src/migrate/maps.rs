//! What /proc/self/maps says about a range.

use super::MigrateError;

struct Vma {
    start: usize,
    end: usize,
    private: bool,
    anon: bool,
    what: String,
}

fn vmas() -> Vec<Vma> {
    let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (a, b) = f.next()?.split_once('-')?;
            let perms = f.next()?;
            let _off = f.next()?;
            let _dev = f.next()?;
            let inode: u64 = f.next()?.parse().ok()?;
            let path = f.collect::<Vec<_>>().join(" ");
            Some(Vma {
                start: usize::from_str_radix(a, 16).ok()?,
                end: usize::from_str_radix(b, 16).ok()?,
                private: perms.ends_with('p'),
                anon: inode == 0 && (path.is_empty() || path == "[heap]"),
                what: if path.is_empty() {
                    "anonymous".into()
                } else {
                    path
                },
            })
        })
        .collect()
}

/// The VMAs covering `[addr, addr + len)`, or the first unmapped address.
fn covering(addr: usize, len: usize) -> Result<Vec<Vma>, MigrateError> {
    let end = addr + len;
    let mut at = addr;
    let mut out = Vec::new();
    for v in vmas().into_iter().filter(|v| v.end > addr && v.start < end) {
        if v.start > at {
            return Err(MigrateError::Unmapped { addr: at });
        }
        at = v.end;
        out.push(v);
    }
    if at < end {
        return Err(MigrateError::Unmapped { addr: at });
    }
    Ok(out)
}

pub fn check_mapped(addr: usize, len: usize) -> Result<(), MigrateError> {
    covering(addr, len).map(drop)
}

pub fn check_private_anon(addr: usize, len: usize) -> Result<(), MigrateError> {
    for v in covering(addr, len)? {
        if !v.private || !v.anon {
            return Err(MigrateError::NotPrivateAnon {
                addr: v.start.max(addr),
                what: format!(
                    "{} {}",
                    if v.private { "private" } else { "shared" },
                    v.what
                ),
            });
        }
    }
    Ok(())
}
