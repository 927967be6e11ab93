//! What /proc/self/smaps says about the mappings of a range, and whether
//! relocation can keep every one of their attributes.

use super::{MigrateError, Refusal};
pub use crate::sys::vma::{overlapping, Vma};

/// The mappings covering `[addr, addr + len)`, or the first unmapped
/// address.
pub fn covering(addr: usize, len: usize) -> Result<Vec<Vma>, MigrateError> {
    let vmas = overlapping(addr, len).map_err(|source| MigrateError::Sys {
        what: "read /proc/self/smaps",
        source,
    })?;
    let end = addr + len;
    let mut at = addr;
    let mut out = Vec::new();
    for v in vmas {
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

/// VmFlags relocation refuses, and what they mean. Everything else is kept
/// because relocation never touches the mapping itself, only its pages.
const REFUSED: &[(&str, &str)] = &[
    ("sh", "shared mapping"),
    ("io", "I/O memory (VM_IO)"),
    ("pf", "raw PFN mapping (VM_PFNMAP)"),
    ("mm", "mixed PFN mapping (VM_MIXEDMAP)"),
    ("ht", "hugetlb mapping (the kernel path handles it)"),
    ("ss", "shadow stack"),
    ("gd", "grows-down stack mapping"),
    ("sl", "sealed mapping (mseal)"),
    (
        "ui",
        "already registered with another userfaultfd (minor mode)",
    ),
    (
        "uw",
        "already registered with another userfaultfd (write-protect)",
    ),
    (
        "um",
        "already registered with another userfaultfd (missing mode)",
    ),
];

/// Why relocation cannot keep this mapping's semantics, if it cannot.
pub fn refusal(v: &Vma) -> Option<Refusal> {
    if !v.private() || !v.anon() {
        let kind = if v.private() { "private" } else { "shared" };
        let what = if v.path.is_empty() {
            "anonymous memory".to_owned()
        } else {
            v.path.clone()
        };
        return Some(Refusal::NotPrivateAnon {
            what: format!("{kind} {what}"),
        });
    }
    if v.prot() & (libc::PROT_READ | libc::PROT_WRITE) != libc::PROT_READ | libc::PROT_WRITE {
        return Some(Refusal::NotReadWrite {
            perms: v.perms[..3.min(v.perms.len())].to_owned(),
        });
    }
    REFUSED
        .iter()
        .find(|(f, _)| v.has(f))
        .map(|&(flag, meaning)| Refusal::Flag { flag, meaning })
}

/// Whether the thread running relocation (a helper, see `relocate`) or
/// the channels it waits for would themselves touch the range while a
/// batch is out: a stack of foliokit's threads, the shared channel pools,
/// or heap space the allocator hands out (probed with allocations of a
/// few sizes). They would then wait on the relocation's userfaultfd.
fn own_memory(addr: usize, len: usize) -> Option<&'static str> {
    let inside = |p: usize| p >= addr && p < addr + len;
    let local = 0u8;
    if inside(std::ptr::addr_of!(local) as usize) {
        return Some("the relocating thread's stack");
    }
    let end = addr.saturating_add(len);
    let meets = |ranges: Vec<(usize, usize)>| ranges.iter().any(|&(lo, hi)| lo < end && hi > addr);
    if meets(crate::worker::own_stacks()) {
        return Some("the stack of one of foliokit's own threads");
    }
    if meets(crate::channels::shared_pool_ranges()) {
        return Some("foliokit's shared copy channels");
    }
    // Any thread, foliokit's among them, may touch it at any time
    // (malloc's main arena, the loader's and stdio's locks, statics).
    if meets(object_data()) {
        return Some(
            "a loaded object's data or .bss (the C library's state, the allocator's among it)",
        );
    }
    let probes: [Vec<u8>; 3] = [vec![0; 64], vec![0; 4096], vec![0; 64 << 10]];
    probes
        .iter()
        .any(|v| inside(v.as_ptr() as usize))
        .then_some("heap space the calling thread's allocator hands out")
}

/// The writable segments (`.data`, `.bss`) of every object loaded in this
/// process, `[lo, hi)`, from the program headers the loader keeps. Their
/// anonymous part (the `.bss` past the file) is indistinguishable from
/// any other anonymous mapping in /proc/self/maps.
fn object_data() -> Vec<(usize, usize)> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        out: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid `info` whose `dlpi_phdr` holds
        // `dlpi_phnum` headers, for the duration of the call; `out` is the
        // Vec given to `dl_iterate_phdr` below, used by this call alone.
        unsafe {
            let (info, out) = (&*info, &mut *out.cast::<Vec<(usize, usize)>>());
            for i in 0..usize::from(info.dlpi_phnum) {
                let ph = &*info.dlpi_phdr.add(i);
                if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_W != 0 {
                    let lo = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
                    out.push((lo, lo.saturating_add(ph.p_memsz as usize)));
                }
            }
        }
        0
    }
    let mut out: Vec<(usize, usize)> = Vec::new();
    // SAFETY: `each` only reads what the loader hands it and pushes to
    // `out`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut out as *mut Vec<(usize, usize)>).cast()) };
    out
}

/// Checks that every mapping of the range can be relocated with its
/// semantics kept; returns them.
pub fn relocatable(addr: usize, len: usize) -> Result<Vec<Vma>, MigrateError> {
    if let Some(what) = own_memory(addr, len) {
        return Err(MigrateError::Refused {
            addr,
            why: Refusal::OwnMemory { what },
        });
    }
    let vmas = covering(addr, len)?;
    for v in &vmas {
        if let Some(why) = refusal(v) {
            return Err(MigrateError::Refused {
                addr: v.start.max(addr),
                why,
            });
        }
    }
    Ok(vmas)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::vma::parse;

    const SMAPS: &str = "\
7f0000000000-7f0000200000 rw-p 00000000 00:00 0 
Size:               2048 kB
VmFlags: rd wr mr mw me ac hg wf 
7f0000200000-7f0000201000 r-xp 00000000 00:00 0 
Size:                  4 kB
VmFlags: rd ex mr mw me 
7f0000300000-7f0000400000 rw-s 00000000 00:01 1234                       /dev/zero (deleted)
VmFlags: rd wr sh mr mw me ms 
7f0000400000-7f0000401000 rw-p 00000000 00:00 0 
VmFlags: rd wr mr mw me ac sl 
";

    #[test]
    fn parses_and_judges_each_mapping() {
        let v = parse(SMAPS);
        assert_eq!(v.len(), 4);
        assert_eq!((v[0].start, v[0].end), (0x7f0000000000, 0x7f0000200000));
        assert!(v[0].has("hg") && v[0].has("wf"));
        assert!(
            refusal(&v[0]).is_none(),
            "rw private anon with advice is kept"
        );
        assert!(
            matches!(refusal(&v[1]), Some(Refusal::NotReadWrite { ref perms }) if perms == "r-x")
        );
        assert!(matches!(
            refusal(&v[2]),
            Some(Refusal::NotPrivateAnon { .. })
        ));
        assert!(matches!(
            refusal(&v[3]),
            Some(Refusal::Flag { flag: "sl", .. })
        ));
        assert_eq!(v[1].prot(), libc::PROT_READ | libc::PROT_EXEC);
    }
}
