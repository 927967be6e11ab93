//! The migration contract, attribute by attribute: relocation either keeps
//! a mapping exactly what it was (address range, protections, VmFlags and
//! advice, lock state, memory policy, holes, VMA count, neighbours) or
//! refuses with a typed error before touching anything; `Auto` always
//! succeeds (relocating with attributes kept, or on the kernel path with a
//! note saying why); the kernel path keeps everything trivially.
//!
//! Every test runs in its own process (`in_child`): the mappings made here
//! (sealed, locked, registered with a userfaultfd) would otherwise outlive
//! the test or disturb its neighbours.

mod common;

use common::{in_child, missing, node, pattern, relocation_available, skip, Need, MIB, PAGE};
use foliokit::migrate::{
    migrate, MigrateError, MigrateOptions, MigratePath, MigrateReport, Path, Refusal,
};
use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const GIB: usize = 1 << 30;
/// Size of each neighbouring mapping.
const NB: usize = 16 * PAGE;
const T: Duration = Duration::from_secs(60);
const RW: libc::c_int = libc::PROT_READ | libc::PROT_WRITE;
const PATHS: [Path; 3] = [Path::Relocate, Path::Auto, Path::Kernel];
static ZERO_PAGE: [u8; PAGE] = [0; PAGE];

fn opts(path: Path) -> MigrateOptions {
    common::opts(path, 256)
}

fn errno() -> io::Error {
    io::Error::last_os_error()
}

// ---------------------------------------------------------------------------
// Raw mappings.

/// A private anonymous mapping of our own (`MAP_FIXED` at `at` if given).
/// Makes this process allocate on [`node`], so that migrating there moves
/// nothing and page frames can be compared before and after, also on
/// machines with several nodes (a task policy: the mappings' own policies,
/// which the tests compare, stay default).
fn allocate_on_the_target_node() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mask: libc::c_ulong = 1 << node();
        // SAFETY: set_mempolicy(2) with a one-word node mask we own.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_set_mempolicy,
                1, // MPOL_PREFERRED
                &mask as *const libc::c_ulong,
                libc::c_ulong::BITS as libc::c_ulong,
            )
        };
        assert_eq!(rc, 0, "set_mempolicy: {}", errno());
    });
}

fn map(at: Option<usize>, len: usize, prot: libc::c_int, extra: libc::c_int) -> usize {
    allocate_on_the_target_node();
    // SAFETY: with `at`, it lies inside a reservation this test made and
    // owns.
    unsafe { common::map_anonymous(at, len, prot, libc::MAP_PRIVATE | extra) as usize }
}

fn unmap(at: usize, len: usize) {
    // SAFETY: only called on mappings this test made; nothing refers to them.
    // Sealed mappings refuse (EPERM), which is fine: the process ends soon.
    unsafe { libc::munmap(at as *mut _, len) };
}

fn mprotect(at: usize, len: usize, prot: libc::c_int) -> io::Result<()> {
    // SAFETY: a mapping of this test's; no Rust reference into it is live.
    if unsafe { libc::mprotect(at as *mut _, len, prot) } != 0 {
        return Err(errno());
    }
    Ok(())
}

fn madvise(at: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: a mapping of this test's; the advice used here drops no data.
    if unsafe { libc::madvise(at as *mut _, len, advice) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// Writes `bytes` at `at` (a writable mapping of ours).
fn fill(at: usize, bytes: &[u8]) {
    // SAFETY: `at .. at + bytes.len()` is a writable mapping of this test's
    // that no reference aliases.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at as *mut u8, bytes.len()) };
}

/// The bytes of `[at, at + len)` read through /proc/self/mem (works on
/// PROT_NONE too, and never changes the mapping); `None` if the kernel
/// forbids it.
fn read_mem(at: usize, len: usize) -> Option<Vec<u8>> {
    let f = std::fs::File::open("/proc/self/mem").ok()?;
    let mut v = vec![0u8; len];
    f.read_exact_at(&mut v, at as u64).ok()?;
    Some(v)
}

/// The bytes of `[at, at + len)`, through /proc/self/mem, else by making
/// the range readable for a moment (only ever after its attributes were
/// recorded).
fn contents(at: usize, len: usize, prot: libc::c_int) -> Vec<u8> {
    if let Some(v) = read_mem(at, len) {
        return v;
    }
    if prot & libc::PROT_READ == 0 {
        mprotect(at, len, libc::PROT_READ).expect("mprotect to read");
    }
    // SAFETY: readable now; no writer runs.
    let v = unsafe { std::slice::from_raw_parts(at as *const u8, len) }.to_vec();
    if prot & libc::PROT_READ == 0 {
        mprotect(at, len, prot).expect("mprotect back");
    }
    v
}

/// Panics with the first differing page if `got != want`.
fn assert_bytes(what: &str, got: &[u8], want: &[u8]) {
    if got == want {
        return;
    }
    let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    panic!(
        "{what}: data changed, first at byte {i:#x} (page {}): {:#04x} != {:#04x}",
        i / PAGE,
        got[i],
        want[i]
    );
}

// ---------------------------------------------------------------------------
// What /proc says about a range.

fn parse_range(tok: &str) -> Option<(usize, usize)> {
    let (a, b) = tok.split_once('-')?;
    Some((
        usize::from_str_radix(a, 16).ok()?,
        usize::from_str_radix(b, 16).ok()?,
    ))
}

/// One VMA: its /proc/self/maps line, VmFlags (sorted) and policy.
#[derive(Debug, Clone, PartialEq, Eq)]
struct VmaAttrs {
    line: String,
    flags: Vec<String>,
    policy: String,
}

impl VmaAttrs {
    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
    fn perms(&self) -> &str {
        self.line.split(' ').nth(1).unwrap_or("")
    }
}

/// Everything recorded about the VMAs overlapping a range.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snap {
    vmas: Vec<VmaAttrs>,
    rss_kb: u64,
    locked_kb: u64,
    anon_huge_kb: u64,
}

/// A field's value for a VMA that reaches past the range, from its range
/// and flags (`None`: take smaps' value).
type FromFlags<'a> = dyn Fn((usize, usize), &[String]) -> Option<u64> + 'a;

fn snapshot(addr: usize, len: usize) -> Snap {
    let end = addr + len;
    let overlaps = |(s, e): (usize, usize)| e > addr && s < end;
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    let lines: Vec<((usize, usize), String)> = maps
        .lines()
        .filter_map(|l| {
            let r = parse_range(l.split_whitespace().next()?)?;
            Some((r, l.split_whitespace().collect::<Vec<_>>().join(" ")))
        })
        .filter(|(r, _)| overlaps(*r))
        .collect();
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
    // (range, VmFlags, fields in kB)
    type Entry = ((usize, usize), Vec<String>, BTreeMap<String, u64>);
    let mut entries: Vec<Entry> = Vec::new();
    for l in smaps.lines() {
        if let Some(r) = l.split_whitespace().next().and_then(parse_range) {
            entries.push((r, Vec::new(), BTreeMap::new()));
            continue;
        }
        let Some(cur) = entries.last_mut() else {
            continue;
        };
        if let Some(f) = l.strip_prefix("VmFlags:") {
            let mut f: Vec<String> = f.split_whitespace().map(str::to_owned).collect();
            f.sort();
            cur.1 = f;
        } else if let Some((k, v)) = l.split_once(':') {
            if let Some(n) = v.split_whitespace().next().and_then(|n| n.parse().ok()) {
                cur.2.insert(k.to_owned(), n);
            }
        }
    }
    entries.retain(|(r, _, _)| overlaps(*r));
    let numa = std::fs::read_to_string("/proc/self/numa_maps").unwrap_or_default();
    let policy: BTreeMap<usize, String> = numa
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let a = usize::from_str_radix(f.next()?, 16).ok()?;
            Some((a, f.next()?.to_owned()))
        })
        .collect();
    assert_eq!(
        lines.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        entries.iter().map(|(r, _, _)| *r).collect::<Vec<_>>(),
        "maps and smaps disagree (the mappings changed while read)"
    );
    // The kernel may merge the mapping with a neighbour that has the same
    // flags (a thread stack mapped next to it, say), so a VMA can reach past
    // the range: describe only the part inside it. Rss comes from mincore
    // over exactly the range; Locked and AnonHugePages from smaps for VMAs
    // inside the range, from the flags (lo: all resident pages locked; nh:
    // none huge) for one that reaches past it.
    let inside = |(s, e): (usize, usize)| s >= addr && e <= end;
    let rss_kb = (resident_pages(addr, len) * PAGE / 1024) as u64;
    // Resident kB of one VMA's part inside the range.
    let clipped_kb = |(s, e): (usize, usize)| {
        let (a, b) = (s.max(addr), e.min(end));
        (resident_pages(a, b - a) * PAGE / 1024) as u64
    };
    let field = |k: &str, from_flags: &FromFlags| {
        entries
            .iter()
            .map(|(r, f, m)| {
                if inside(*r) {
                    m.get(k).copied().unwrap_or(0)
                } else {
                    from_flags(*r, f).unwrap_or_else(|| m.get(k).copied().unwrap_or(0))
                }
            })
            .sum()
    };
    let has = |f: &[String], x: &str| f.iter().any(|g| g == x);
    Snap {
        rss_kb,
        locked_kb: field("Locked", &|r, f| {
            Some(if has(f, "lo") { clipped_kb(r) } else { 0 })
        }),
        anon_huge_kb: field("AnonHugePages", &|_, f| has(f, "nh").then_some(0)),
        vmas: lines
            .iter()
            .zip(&entries)
            .map(|(((s, e), line), (_, flags, _))| VmaAttrs {
                line: clip(line, (*s).max(addr), (*e).min(end)),
                flags: flags.clone(),
                policy: policy
                    .get(s)
                    .cloned()
                    .unwrap_or_else(|| "<not in numa_maps>".into()),
            })
            .collect(),
    }
}

/// A maps line with its range replaced by `[s, e)`.
fn clip(line: &str, s: usize, e: usize) -> String {
    match line.split_once(' ') {
        Some((_, rest)) => format!("{s:x}-{e:x} {rest}"),
        None => line.to_string(),
    }
}

/// Pages of `[addr, addr + len)` resident now.
fn resident_pages(addr: usize, len: usize) -> usize {
    foliokit::mem::resident_pages(addr as *const u8, len).expect("mincore")
}

fn show(s: &Snap) -> String {
    let mut out = String::new();
    for v in &s.vmas {
        out += &format!(
            "\n    {}  policy {}  VmFlags: {}",
            v.line,
            v.policy,
            v.flags.join(" ")
        );
    }
    out += &format!(
        "\n    Rss {} kB, Locked {} kB, AnonHugePages {} kB",
        s.rss_kb, s.locked_kb, s.anon_huge_kb
    );
    out
}

fn assert_same(what: &str, before: &Snap, after: &Snap) {
    assert_eq!(
        before.vmas.len(),
        after.vmas.len(),
        "{what}: the number of VMAs covering the range changed\n  before:{}\n  after:{}",
        show(before),
        show(after)
    );
    assert!(
        before == after,
        "{what}: attributes changed\n  before:{}\n  after:{}",
        show(before),
        show(after)
    );
}

/// /proc/self/pagemap entries of `pages` pages from `at`.
fn pagemap(at: usize, pages: usize) -> Vec<u64> {
    let f = std::fs::File::open("/proc/self/pagemap").expect("open pagemap");
    let mut raw = vec![0u8; pages * 8];
    f.read_exact_at(&mut raw, (at / PAGE * 8) as u64)
        .expect("read pagemap");
    raw.chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

const PM_PRESENT: u64 = 1 << 63;
const PM_PFN: u64 = (1 << 55) - 1;

/// PFNs of the range (0 for a non-present page), or `None` when the kernel
/// hides them (no CAP_SYS_ADMIN).
fn pfns(at: usize, pages: usize) -> Option<Vec<u64>> {
    let pm = pagemap(at, pages);
    let v: Vec<u64> = pm
        .iter()
        .map(|&e| if e & PM_PRESENT != 0 { e & PM_PFN } else { 0 })
        .collect();
    let present = pm.iter().filter(|&&e| e & PM_PRESENT != 0).count();
    (present == 0 || v.iter().any(|&p| p != 0)).then_some(v)
}

const KPF_UNEVICTABLE: u64 = 1 << 18;
const KPF_MLOCKED: u64 = 1 << 33;

/// /proc/kpageflags of each PFN, or `None` if unreadable.
fn kpageflags(pfns: &[u64]) -> Option<Vec<u64>> {
    let f = std::fs::File::open("/proc/kpageflags").ok()?;
    pfns.iter()
        .map(|&p| {
            let mut b = [0u8; 8];
            f.read_exact_at(&mut b, p * 8).ok()?;
            Some(u64::from_ne_bytes(b))
        })
        .collect()
}

fn status_kb(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("read /proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/self/status"))
}

/// Checks the report of a call that succeeded; `pages` is the number of
/// populated pages of the migrated range. Returns the path taken.
fn check_report(what: &str, path: Path, rep: &MigrateReport, pages: usize) -> MigratePath {
    match path {
        Path::Relocate => assert_eq!(rep.path, MigratePath::Relocate, "{what}: {rep:?}"),
        Path::Kernel => assert_eq!(rep.path, MigratePath::Kernel, "{what}: {rep:?}"),
        Path::Auto => {
            if rep.path == MigratePath::Kernel {
                assert!(
                    rep.notes.iter().any(|n| n.starts_with("kernel path:")),
                    "{what}: Auto took the kernel path without saying why: {:?}",
                    rep.notes
                );
            }
        }
    }
    if rep.path == MigratePath::Relocate {
        assert_eq!(rep.dropped_pages, 0, "{what}: dropped pages: {rep:?}");
        assert_eq!(
            rep.pages_to_move, pages,
            "{what}: populated pages found: {rep:?}"
        );
        assert_eq!(
            (rep.relocated_pages, rep.left_in_place),
            (pages, 0),
            "{what}: every populated page should be in a new folio; notes {:?}",
            rep.notes
        );
    }
    rep.path
}

// ---------------------------------------------------------------------------
// Test 1: one mapping with one attribute, between two neighbours.

type Setup = fn(usize, usize) -> Result<(), String>;

fn nothing(_: usize, _: usize) -> Result<(), String> {
    Ok(())
}

fn advice(at: usize, len: usize, a: libc::c_int, name: &str) -> Result<(), String> {
    madvise(at, len, a).map_err(|e| format!("madvise({name}) failed: {e}"))
}

fn do_mlock(at: usize, len: usize) -> Result<(), String> {
    // SAFETY: locks a mapping of this test's.
    if unsafe { libc::mlock(at as *const _, len) } != 0 {
        return Err(format!("mlock failed: {}", errno()));
    }
    Ok(())
}

fn do_mlock_onfault(at: usize, len: usize) -> Result<(), String> {
    const MLOCK_ONFAULT: libc::c_ulong = 1;
    // SAFETY: locks a mapping of this test's.
    if unsafe { libc::syscall(libc::SYS_mlock2, at, len, MLOCK_ONFAULT) } != 0 {
        return Err(format!("mlock2(MLOCK_ONFAULT) failed: {}", errno()));
    }
    Ok(())
}

fn do_dontfork(at: usize, len: usize) -> Result<(), String> {
    advice(at, len, libc::MADV_DONTFORK, "DONTFORK")
}
fn do_wipeonfork(at: usize, len: usize) -> Result<(), String> {
    advice(at, len, libc::MADV_WIPEONFORK, "WIPEONFORK")
}
fn do_dontdump(at: usize, len: usize) -> Result<(), String> {
    advice(at, len, libc::MADV_DONTDUMP, "DONTDUMP")
}
fn do_nohuge(at: usize, len: usize) -> Result<(), String> {
    advice(at, len, libc::MADV_NOHUGEPAGE, "NOHUGEPAGE")
}
fn do_huge(at: usize, len: usize) -> Result<(), String> {
    advice(at, len, libc::MADV_HUGEPAGE, "HUGEPAGE")
}
/// Splits the mapping in two VMAs: DONTDUMP on the first half only.
fn do_half_dontdump(at: usize, len: usize) -> Result<(), String> {
    advice(at, len / 2, libc::MADV_DONTDUMP, "DONTDUMP")
}

fn do_bind(at: usize, len: usize) -> Result<(), String> {
    const MPOL_BIND: libc::c_ulong = 2;
    let mask: [u64; 2] = {
        let n = node() as usize;
        let mut m = [0u64; 2];
        m[n / 64] |= 1 << (n % 64);
        m
    };
    // SAFETY: mbind reads `mask` (128 bits, maxnode 129) and changes only
    // the policy of a mapping of this test's.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            at,
            len,
            MPOL_BIND,
            mask.as_ptr(),
            129 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc != 0 {
        return Err(format!("mbind(MPOL_BIND) failed: {}", errno()));
    }
    Ok(())
}

fn do_seal(at: usize, len: usize) -> Result<(), String> {
    /// mseal(2): 462 on x86_64 (and in the generic syscall table).
    const SYS_MSEAL: libc::c_long = 462;
    // SAFETY: seals a mapping of this test's (it can then never be
    // unmapped, which the process-per-test harness tolerates).
    if unsafe { libc::syscall(SYS_MSEAL, at, len, 0 as libc::c_ulong) } != 0 {
        return Err(format!("mseal unavailable: {}", errno()));
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct Case {
    /// Final protections of the mapping.
    prot: libc::c_int,
    /// Extra mmap flags.
    map_flags: libc::c_int,
    /// Before the data is written (advice that shapes faults, policy).
    pre: Setup,
    /// After the data is written and the protections set.
    post: Setup,
    /// VmFlags each VMA of the mapping must show (checks the setup).
    flags: &'static [&'static str],
    /// Expect `bind:<node>` in numa_maps.
    bind: bool,
    /// Size of the mapping.
    len: usize,
    /// Migrate only `[offset, offset + len)` of it.
    sub: Option<(usize, usize)>,
    /// VMAs the mapping must consist of.
    vmas: usize,
}

const BASE: Case = Case {
    prot: RW,
    map_flags: 0,
    pre: nothing,
    post: nothing,
    flags: &[],
    bind: false,
    len: 4 * MIB,
    sub: None,
    vmas: 1,
};

/// A mapping of one case at a 2 MiB-aligned address, flanked by two
/// mappings with other protections.
struct Layout {
    left: usize,
    start: usize,
    len: usize,
    right: usize,
    left_prot: libc::c_int,
    right_prot: libc::c_int,
    data: Vec<u8>,
    left_data: Vec<u8>,
    right_data: Vec<u8>,
}

impl Drop for Layout {
    fn drop(&mut self) {
        unmap(self.left, NB);
        unmap(self.start, self.len);
        unmap(self.right, NB);
    }
}

impl Layout {
    /// Builds the case's mapping, or says why this kernel cannot.
    fn new(c: &Case, seed: u64) -> Result<Layout, String> {
        let len = c.len;
        let total = NB + len + NB + 2 * MIB;
        let res = map(None, total, libc::PROT_NONE, libc::MAP_NORESERVE);
        let start = (res + NB).next_multiple_of(2 * MIB);
        let (left, right) = (start - NB, start + len);
        unmap(res, left - res);
        unmap(right + NB, res + total - (right + NB));
        let left_prot = if c.prot == libc::PROT_READ {
            libc::PROT_NONE
        } else {
            libc::PROT_READ
        };
        let right_prot = if c.prot == libc::PROT_NONE {
            libc::PROT_READ
        } else {
            libc::PROT_NONE
        };
        let l = Layout {
            left,
            start,
            len,
            right,
            left_prot,
            right_prot,
            data: pattern(len, seed),
            left_data: pattern(NB, seed ^ 0x55),
            right_data: pattern(NB, seed ^ 0xAA),
        };
        for (at, bytes, prot) in [
            (left, &l.left_data, left_prot),
            (right, &l.right_data, right_prot),
        ] {
            map(Some(at), NB, RW, 0);
            fill(at, bytes);
            mprotect(at, NB, prot).expect("mprotect neighbour");
        }
        map(Some(start), len, RW, c.map_flags);
        (c.pre)(start, len)?;
        fill(start, &l.data);
        if c.prot != RW {
            mprotect(start, len, c.prot)
                .map_err(|e| format!("mprotect({:#x}) refused: {e}", c.prot))?;
        }
        (c.post)(start, len)?;
        assert_bytes("setup", &contents(start, len, c.prot), &l.data);
        Ok(l)
    }
}

fn run_case(c: &Case) {
    let reloc = relocation_available();
    for (i, path) in PATHS.into_iter().enumerate() {
        if path == Path::Relocate && !reloc {
            continue; // the probe printed why
        }
        let l = match Layout::new(c, 0xC0FFEE + i as u64) {
            Ok(l) => l,
            Err(why) => {
                skip(&why);
                return;
            }
        };
        one_case(c, &l, path);
    }
}

fn one_case(c: &Case, l: &Layout, path: Path) {
    let what = format!("{path:?}");
    let (mstart, mlen) = c.sub.map_or((l.start, l.len), |(o, n)| (l.start + o, n));
    let pages = l.len / PAGE;
    let before = snapshot(l.start, l.len);
    let left_before = snapshot(l.left, NB);
    let right_before = snapshot(l.right, NB);
    // The setup did what the case says.
    assert_eq!(before.vmas.len(), c.vmas, "setup:{}", show(&before));
    for v in &before.vmas {
        for f in c.flags {
            // Older kernels (6.1 here) print VM_LOCKONFAULT as "??" in smaps:
            // the flag is set, it only has no name there.
            let unnamed = *f == "lf" && v.has("??");
            assert!(
                v.has(f) || unnamed,
                "setup: no VmFlags '{f}':{}",
                show(&before)
            );
        }
        if c.bind {
            assert_eq!(v.policy, format!("bind:{}", node()), "{}", show(&before));
        }
    }
    let perms = format!(
        "{}{}{}p",
        if c.prot & libc::PROT_READ != 0 {
            'r'
        } else {
            '-'
        },
        if c.prot & libc::PROT_WRITE != 0 {
            'w'
        } else {
            '-'
        },
        if c.prot & libc::PROT_EXEC != 0 {
            'x'
        } else {
            '-'
        },
    );
    assert!(
        before.vmas.iter().all(|v| v.perms() == perms),
        "setup:{}",
        show(&before)
    );
    assert_eq!(left_before.vmas.len(), 1, "{}", show(&left_before));
    assert_eq!(right_before.vmas.len(), 1, "{}", show(&right_before));
    let pfn_before = pfns(l.start, pages);
    let locked_before = pfn_before.as_deref().and_then(kpageflags);

    // SAFETY: the mapping is this test's own; nothing else uses it.
    let res = unsafe { migrate(mstart as *mut u8, mlen, node(), &opts(path)) };

    // Attributes first, before anything touches the range.
    let after = snapshot(l.start, l.len);
    assert_same(&what, &before, &after);
    assert!(
        after.vmas.iter().all(|v| v.perms() == perms),
        "{what}:{}",
        show(&after)
    );
    assert_same(
        &format!("{what}: left neighbour"),
        &left_before,
        &snapshot(l.left, NB),
    );
    assert_same(
        &format!("{what}: right neighbour"),
        &right_before,
        &snapshot(l.right, NB),
    );
    let pfn_after = pfns(l.start, pages);

    let taken = match &res {
        Ok(rep) => {
            let p = check_report(&what, path, rep, mlen / PAGE);
            println!(
                "NOTE: {path:?} -> Ok via {p}, relocated {} pages, notes {:?}",
                rep.relocated_pages, rep.notes
            );
            Some(p)
        }
        Err(MigrateError::Refused { addr, why }) if path == Path::Relocate => {
            assert!(
                (mstart..mstart + mlen).contains(addr),
                "{what}: refusal at {addr:#x}, outside the range"
            );
            let kind = match why {
                Refusal::Flag { flag, .. } => format!("Flag({flag})"),
                Refusal::NotReadWrite { perms } => format!("NotReadWrite({perms})"),
                other => format!("{other:?}"),
            };
            println!("NOTE: {path:?} -> Refused {kind}: {why}");
            None
        }
        Err(e) => panic!("{what}: unexpected error {e:?}"),
    };

    // Which pages moved: relocation puts every page of the migrated range
    // in a new folio and no other; a refusal or the kernel path on one node
    // moves none.
    if let (Some(b), Some(a)) = (&pfn_before, &pfn_after) {
        for i in 0..pages {
            let addr = l.start + i * PAGE;
            let inside = (mstart..mstart + mlen).contains(&addr);
            if taken == Some(MigratePath::Relocate) && inside {
                assert_ne!(b[i], a[i], "{what}: page {addr:#x} was not relocated");
            } else if taken.is_none() || !inside {
                assert_eq!(b[i], a[i], "{what}: page {addr:#x} moved");
            }
        }
    }
    // Lock state of the pages themselves, not only the VMA's flag.
    if let (Some(lb), Some(la)) = (locked_before, pfn_after.as_deref().and_then(kpageflags)) {
        if lb.iter().all(|f| f & KPF_MLOCKED != 0) {
            for (i, f) in la.iter().enumerate() {
                assert!(
                    f & KPF_MLOCKED != 0,
                    "{what}: page {:#x} of an mlocked mapping is no longer mlocked (kpageflags {f:#x})",
                    l.start + i * PAGE
                );
            }
            let unevictable = la.iter().filter(|&&f| f & KPF_UNEVICTABLE != 0).count();
            println!("NOTE: {path:?}: {unevictable}/{pages} mlocked pages unevictable after");
        }
    }
    if c.flags.contains(&"nh") {
        assert_eq!(after.anon_huge_kb, 0, "{what}: THP in a NOHUGEPAGE mapping");
    }

    // Now the data: the range, then the neighbours.
    assert_bytes(&what, &contents(l.start, l.len, c.prot), &l.data);
    assert_bytes(
        &format!("{what}: left neighbour"),
        &contents(l.left, NB, l.left_prot),
        &l.left_data,
    );
    assert_bytes(
        &format!("{what}: right neighbour"),
        &contents(l.right, NB, l.right_prot),
        &l.right_data,
    );
    if c.prot & libc::PROT_READ != 0 {
        // SAFETY: readable mapping of ours, no writer.
        let direct = unsafe { std::slice::from_raw_parts(l.start as *const u8, l.len) };
        assert_bytes(&format!("{what}: direct read"), direct, &l.data);
    }
    if c.prot & libc::PROT_WRITE != 0 {
        // What the process writes is what everyone else reads.
        for i in 0..pages {
            // SAFETY: writable mapping of ours, no other user.
            unsafe { ((l.start + i * PAGE) as *mut u8).write_volatile(!l.data[i * PAGE]) };
        }
        if let Some(m) = read_mem(l.start, l.len) {
            for i in 0..pages {
                assert_eq!(m[i * PAGE], !l.data[i * PAGE], "{what}: write lost");
            }
        }
    }
}

macro_rules! attribute_tests {
    ($($(#[$doc:meta])* $name:ident: $case:expr;)*) => {$(
        $(#[$doc])*
        #[test]
        fn $name() {
            in_child(stringify!($name), T, || run_case(&$case));
        }
    )*};
}

attribute_tests! {
    /// Baseline: plain private anonymous read-write memory.
    attrs_plain_rw: BASE;
    attrs_read_only: Case { prot: libc::PROT_READ, ..BASE };
    /// r-x like a JIT region: nothing is executed, only the perms checked.
    attrs_read_exec: Case { prot: libc::PROT_READ | libc::PROT_EXEC, flags: &["ex"], ..BASE };
    attrs_prot_none: Case { prot: libc::PROT_NONE, ..BASE };
    attrs_rwx: Case { prot: RW | libc::PROT_EXEC, flags: &["rd", "wr", "ex"], ..BASE };
    attrs_mlock: Case { post: do_mlock, flags: &["lo"], ..BASE };
    attrs_mlock_onfault: Case { post: do_mlock_onfault, flags: &["lo", "lf"], ..BASE };
    attrs_dontfork: Case { post: do_dontfork, flags: &["dc"], ..BASE };
    attrs_wipeonfork: Case { post: do_wipeonfork, flags: &["wf"], ..BASE };
    attrs_dontdump: Case { post: do_dontdump, flags: &["dd"], ..BASE };
    attrs_nohugepage: Case { pre: do_nohuge, flags: &["nh"], ..BASE };
    attrs_hugepage: Case { pre: do_huge, flags: &["hg"], ..BASE };
    attrs_noreserve: Case { map_flags: libc::MAP_NORESERVE, flags: &["nr"], ..BASE };
    attrs_mbind_bind: Case { pre: do_bind, bind: true, ..BASE };
    attrs_mseal: Case { post: do_seal, flags: &["sl"], ..BASE };
    /// A range of two VMAs (DONTDUMP on the first half): stays two.
    attrs_two_vmas: Case { post: do_half_dontdump, vmas: 2, ..BASE };
    /// Only a misaligned middle part of one mapping is migrated: the
    /// mapping must not be left split, and the rest must not move. 4 KiB
    /// pages: where THP is "always", a huge page straddling a misaligned
    /// edge is split by either path (move_pages too), which is not what
    /// this case is about.
    attrs_middle_of_a_mapping: Case {
        len: 6 * MIB,
        sub: Some((MIB + 5 * PAGE, 3 * MIB)),
        pre: do_nohuge,
        flags: &["nh"],
        ..BASE
    };
}

// ---------------------------------------------------------------------------
// Test 2: fork semantics after (and during) relocation.

/// Runs `check` in a forked child and returns its exit code. The child
/// must only read memory and make raw system calls (no allocation: other
/// threads may hold the allocator's lock), then return a code.
fn in_fork(check: impl FnOnce() -> i32) -> i32 {
    wait_child(fork_child(check))
}

/// Forks a child that runs `check` (same rules as [`in_fork`]) and exits
/// with its code; returns the child's pid.
fn fork_child(check: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the child runs only `check`, which allocates nothing and
    // takes no lock, then `_exit`s without running destructors.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", errno());
    if pid == 0 {
        let code = check();
        // SAFETY: ends the forked child at once.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// The exit code of child `pid` (99 if it hung for 10 s and was killed,
/// 100 + signal if a signal ended it).
fn wait_child(pid: libc::pid_t) -> i32 {
    match common::wait_for_child(pid, Duration::from_secs(10)) {
        Err(_) => 99,
        Ok(status) if libc::WIFEXITED(status) => libc::WEXITSTATUS(status),
        Ok(status) => 100 + libc::WTERMSIG(status),
    }
}

/// In a forked child: whether `[at, at + len)` reads as zeros only.
fn child_reads_zeros(at: usize, len: usize) -> bool {
    // SAFETY: a mapping the child inherited (wipe-on-fork: present, empty).
    let s = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
    s.chunks(PAGE).all(|c| c == &ZERO_PAGE[..c.len()])
}

/// In a forked child: whether no page of `[at, at + len)` is mapped
/// (mincore fails with ENOMEM), and /proc/self/maps has no line starting
/// at `needle` (`"\n<start>-"`). `buf` is preallocated by the parent.
fn child_lacks(at: usize, len: usize, buf: &mut [u8], needle: &[u8]) -> i32 {
    let mut vec = [0u8; 64];
    // SAFETY: mincore writes one byte per page of the range into `vec`
    // (at most 64 pages are asked for) and reads nothing of ours.
    let rc = unsafe { libc::mincore(at as *mut _, len.min(64 * PAGE), vec.as_mut_ptr()) };
    // SAFETY: reads this thread's errno.
    if rc != -1 || unsafe { *libc::__errno_location() } != libc::ENOMEM {
        return 20;
    }
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY) };
    if fd < 0 {
        return 21;
    }
    let mut n = 0;
    loop {
        // SAFETY: reads into the unused tail of `buf`.
        let r = unsafe { libc::read(fd, buf[n..].as_mut_ptr().cast(), buf.len() - n) };
        if r <= 0 {
            break;
        }
        n += r as usize;
        if n == buf.len() {
            break;
        }
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    let text = &buf[..n];
    if text.starts_with(&needle[1..]) || text.windows(needle.len()).any(|w| w == needle) {
        return 22;
    }
    0
}

/// A plain read-write mapping filled with a pattern, advised `advice`.
/// A filled mapping with `advice_` given before the first touch (so
/// NOHUGEPAGE means 4 KiB pages even where THP is "always").
fn advised(len: usize, advice_: libc::c_int, seed: u64) -> (usize, Vec<u8>) {
    let at = map(None, len, RW, 0);
    madvise(at, len, advice_).expect("madvise");
    let data = pattern(len, seed);
    fill(at, &data);
    (at, data)
}

/// Migrates `[at, at + len)` on `path`; `None` if relocation refused.
fn migrate_ok(at: usize, len: usize, path: Path) -> Option<MigrateReport> {
    // SAFETY: a mapping of the caller's that nothing else uses meanwhile
    // (or, in the concurrent test, only touches in ways the contract allows).
    match unsafe { migrate(at as *mut u8, len, node(), &opts(path)) } {
        Ok(r) => Some(r),
        Err(e @ MigrateError::Refused { .. }) if path == Path::Relocate => {
            println!("NOTE: {path:?} refused: {e}");
            None
        }
        Err(e) => panic!("{path:?}: {e:?}"),
    }
}

/// Each path in turn (relocation where available) on a fresh 4 MiB range
/// advised `advice` (bytes from `seed`): `prepare` sees the range's address
/// and its mappings before and makes what the child needs (in the parent:
/// a forked child must not allocate); after the migration the mappings and
/// the bytes are as they were, and a child forked then runs
/// `child(at, len, prepared)`, which must exit 0 (else, it `fails`: what a
/// non-zero exit means).
fn fork_after_migration<P>(
    advice: libc::c_int,
    seed: u64,
    mut prepare: impl FnMut(usize, &Snap) -> P,
    mut child: impl FnMut(usize, usize, &P) -> i32,
    fails: &str,
) {
    let reloc = relocation_available();
    for path in PATHS {
        if path == Path::Relocate && !reloc {
            continue;
        }
        let len = 4 * MIB;
        let (at, data) = advised(len, advice, seed);
        let before = snapshot(at, len);
        let prepared = prepare(at, &before);
        if let Some(rep) = migrate_ok(at, len, path) {
            check_report(&format!("{path:?}"), path, &rep, len / PAGE);
            println!("NOTE: {path:?} -> {}", rep.path);
        }
        assert_same(&format!("{path:?}"), &before, &snapshot(at, len));
        let code = in_fork(|| child(at, len, &prepared));
        assert_eq!(
            code, 0,
            "{path:?}: a child forked after migration {fails} (exit {code})"
        );
        assert_bytes(
            &format!("{path:?}: parent"),
            &read_mem(at, len).unwrap(),
            &data,
        );
        unmap(at, len);
    }
}

#[test]
fn wipeonfork_child_reads_zeros_after_migration() {
    in_child("wipeonfork_child_reads_zeros_after_migration", T, || {
        fork_after_migration(
            libc::MADV_WIPEONFORK,
            11,
            |_, _| {},
            |at, len, ()| if child_reads_zeros(at, len) { 0 } else { 1 },
            "did not read zeros in the wipe-on-fork range",
        )
    });
}

#[test]
fn dontfork_child_lacks_the_mapping_after_migration() {
    in_child(
        "dontfork_child_lacks_the_mapping_after_migration",
        T,
        || {
            let mut buf = vec![0u8; 8 * MIB];
            fork_after_migration(
                libc::MADV_DONTFORK,
                12,
                |at, before| {
                    assert!(before.vmas[0].line.starts_with(&format!("{at:x}-")));
                    format!("\n{at:x}-").into_bytes()
                },
                |at, len, needle| child_lacks(at, len, &mut buf, needle),
                "has the DONTFORK mapping (20: mincore found it, 22: in its /proc/self/maps)",
            )
        },
    );
}

/// Children forked while relocation runs: a wipe-on-fork range reads zero,
/// a DONTFORK range is absent, a plain range holds the parent's bytes.
#[test]
fn children_forked_during_relocation() {
    in_child("children_forked_during_relocation", T, || {
        if !relocation_available() {
            return;
        }
        let len = 16 * MIB;
        let (wf, _) = advised(len, libc::MADV_WIPEONFORK, 21);
        let (df, _) = advised(len, libc::MADV_DONTFORK, 22);
        let (plain, plain_data) = advised(len, libc::MADV_NORMAL, 23);
        let wf_data = read_mem(wf, len).unwrap();
        let df_data = read_mem(df, len).unwrap();
        let before: Vec<Snap> = [wf, df, plain].map(|a| snapshot(a, len)).into();
        let stop = AtomicBool::new(false);
        let forks = AtomicUsize::new(0);
        let mut bad: Vec<i32> = Vec::new();
        let mut buf = vec![0u8; 8 * MIB];
        let needle = format!("\n{df:x}-").into_bytes();
        let mut runs = 0;
        let mut relocated = 0;
        std::thread::scope(|s| {
            let forker = s.spawn(|| {
                let mut bad = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let code = in_fork(|| {
                        if !child_reads_zeros(wf, len) {
                            return 10;
                        }
                        let c = child_lacks(df, len, &mut buf, &needle);
                        if c != 0 {
                            return c;
                        }
                        // SAFETY: inherited private copy of the parent's range.
                        let p = unsafe { std::slice::from_raw_parts(plain as *const u8, len) };
                        if p != &plain_data[..] {
                            return 12;
                        }
                        0
                    });
                    forks.fetch_add(1, Ordering::Relaxed);
                    if code != 0 {
                        bad.push(code);
                    }
                }
                bad
            });
            /// Stops the forker even if an assertion below panics.
            struct StopOnDrop<'a>(&'a AtomicBool);
            impl Drop for StopOnDrop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Relaxed);
                }
            }
            let _stop = StopOnDrop(&stop);
            let t = Instant::now();
            let o = opts(Path::Relocate).batch_pages(32);
            while t.elapsed() < Duration::from_millis(1500) {
                for at in [wf, df, plain] {
                    // SAFETY: our own mappings; the forker only forks.
                    let rep = unsafe { migrate(at as *mut u8, len, node(), &o) }
                        .unwrap_or_else(|e| panic!("relocation failed: {e:?}"));
                    // A page shared with a live child is left in place
                    // (contract); nothing may be dropped or lost.
                    assert_eq!(rep.path, MigratePath::Relocate);
                    assert_eq!(rep.dropped_pages, 0, "{rep:?}");
                    assert_eq!(
                        rep.relocated_pages + rep.left_in_place,
                        len / PAGE,
                        "{rep:?}"
                    );
                    relocated += rep.relocated_pages;
                    runs += 1;
                }
            }
            stop.store(true, Ordering::Relaxed);
            bad = forker.join().unwrap();
        });
        let forks = forks.load(Ordering::Relaxed);
        println!("NOTE: {forks} forks during {runs} relocations ({relocated} pages relocated)");
        assert!(forks > 0);
        assert!(
            bad.is_empty(),
            "{} of {forks} children saw the wrong thing (10: wipe-on-fork not zero, \
             20/22: DONTFORK mapping present, 12: plain range differs, 99: hung): {bad:?}",
            bad.len()
        );
        for (i, at) in [wf, df, plain].into_iter().enumerate() {
            assert_same("concurrent", &before[i], &snapshot(at, len));
        }
        assert_bytes("wf", &read_mem(wf, len).unwrap(), &wf_data);
        assert_bytes("df", &read_mem(df, len).unwrap(), &df_data);
        assert_bytes("plain", &read_mem(plain, len).unwrap(), &plain_data);
    });
}

/// Pages shared with a live forked child are left in place (the contract)
/// and the report still counts them as populated pages found; the child
/// keeps seeing its own copy.
#[test]
fn pages_shared_with_a_child_are_left_and_counted() {
    in_child("pages_shared_with_a_child_are_left_and_counted", T, || {
        if !relocation_available() {
            return;
        }
        let len = 4 * MIB;
        let pages = len / PAGE;
        let (at, data) = advised(len, libc::MADV_NOHUGEPAGE, 61);
        let mut fds = [0; 2];
        // SAFETY: creates a pipe into our array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let child = fork_child(|| {
            let mut b = [0u8; 1];
            // SAFETY: blocks on our pipe until the parent is done.
            unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) };
            // SAFETY: the child's private copy of the range.
            let s = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
            if s == &data[..] {
                0
            } else {
                1
            }
        });
        let before = snapshot(at, len);
        let o = opts(Path::Relocate);
        // All pages shared with the child.
        // SAFETY: our own mapping.
        let all_shared = unsafe { migrate(at as *mut u8, len, node(), &o) }.expect("relocate");
        // The parent writes its second half: those pages become its own.
        let mut now = data.clone();
        for i in pages / 2..pages {
            now[i * PAGE] ^= 0xFF;
        }
        fill(at + len / 2, &now[len / 2..]);
        // SAFETY: our own mapping.
        let half = unsafe { migrate(at as *mut u8, len, node(), &o) }.expect("relocate");
        // SAFETY: wakes the child.
        unsafe { libc::write(fds[1], [1u8].as_ptr().cast(), 1) };
        let code = wait_child(child);
        assert_eq!(code, 0, "the child's copy changed (exit {code})");
        assert_same("shared", &before, &snapshot(at, len));
        assert_bytes("parent", &read_mem(at, len).unwrap(), &now);
        println!(
            "NOTE: all shared: relocated {} left {} pages_to_move {}; half shared: relocated {} left {} pages_to_move {}",
            all_shared.relocated_pages,
            all_shared.left_in_place,
            all_shared.pages_to_move,
            half.relocated_pages,
            half.left_in_place,
            half.pages_to_move
        );
        assert_eq!(
            (half.relocated_pages, half.left_in_place, half.pages_to_move),
            (pages / 2, pages / 2, pages),
            "half shared: {half:?}"
        );
        assert_eq!(
            (all_shared.relocated_pages, all_shared.left_in_place),
            (0, pages),
            "all shared: {all_shared:?}"
        );
        assert_eq!(
            all_shared.pages_to_move, pages,
            "all shared: the report says {} populated pages were found, yet it left {} \
             populated pages in place and handed them to move_pages: {:?}",
            all_shared.pages_to_move, all_shared.left_in_place, all_shared.notes
        );
    });
}

// ---------------------------------------------------------------------------
// Test 3: a sparse 1 GiB range stays sparse, and peak memory stays small.

#[test]
fn sparse_gigabyte_stays_sparse() {
    in_child("sparse_gigabyte_stays_sparse", T, || {
        let reloc = relocation_available();
        const PIECE: usize = 2 * MIB;
        const PIECES: usize = 32; // 64 MiB touched
        let piece_data = pattern(PIECE, 31);
        let offsets: Vec<usize> = (0..PIECES)
            .map(|i| i * (GIB / PIECES) + (i * 7 % 15) * MIB + (i % 3) * PAGE)
            .collect();
        for path in PATHS {
            if path == Path::Relocate && !reloc {
                continue;
            }
            let what = format!("{path:?}");
            let at = map(None, GIB, RW, libc::MAP_NORESERVE);
            madvise(at, GIB, libc::MADV_NOHUGEPAGE).expect("NOHUGEPAGE");
            for (i, &o) in offsets.iter().enumerate() {
                fill(at + o, &piece_data);
                fill(at + o, &(i as u64).to_ne_bytes());
            }
            let want = |i: usize| {
                let mut v = piece_data.clone();
                v[..8].copy_from_slice(&(i as u64).to_ne_bytes());
                v
            };
            let before = snapshot(at, GIB);
            let hwm_ok = std::fs::write("/proc/self/clear_refs", "5");
            let rss0 = status_kb("VmRSS:");

            let rep = migrate_ok(at, GIB, path);

            let hwm = status_kb("VmHWM:");
            let after = snapshot(at, GIB);
            assert_eq!(
                before.vmas,
                after.vmas,
                "{what}:\n  before:{}\n  after:{}",
                show(&before),
                show(&after)
            );
            if let Some(rep) = &rep {
                check_report(&what, path, rep, PIECES * PIECE / PAGE);
                println!(
                    "NOTE: {what} -> {} in {:.3} s, Rss {} -> {} kB",
                    rep.path, rep.secs, before.rss_kb, after.rss_kb
                );
            }
            assert!(
                after.rss_kb <= before.rss_kb + 64 * 1024,
                "{what}: Rss of the sparse range grew from {} kB to {} kB",
                before.rss_kb,
                after.rss_kb
            );
            match hwm_ok {
                Ok(()) => {
                    let growth = hwm.saturating_sub(rss0);
                    println!("NOTE: {what}: peak RSS growth during the call {growth} kB");
                    assert!(
                        growth < 256 * 1024,
                        "{what}: peak RSS grew by {growth} kB during the call"
                    );
                }
                Err(e) => skip(&format!("peak RSS not measured: clear_refs: {e}")),
            }
            // Holes stay holes: no page outside the pieces is resident.
            let pm = pagemap(at, GIB / PAGE);
            let mut in_piece = vec![false; GIB / PAGE];
            for &o in &offsets {
                in_piece[o / PAGE..(o + PIECE).div_ceil(PAGE)].fill(true);
            }
            let filled_holes = (0..GIB / PAGE)
                .filter(|&p| !in_piece[p] && pm[p] & PM_PRESENT != 0)
                .count();
            assert_eq!(filled_holes, 0, "{what}: holes were populated");
            // SAFETY: our own readable mapping, no writer.
            let all = unsafe { std::slice::from_raw_parts(at as *const u8, GIB) };
            for (i, &o) in offsets.iter().enumerate() {
                assert_bytes(&format!("{what}: piece {i}"), &all[o..o + PIECE], &want(i));
            }
            let mut prev = 0;
            for &o in &offsets {
                assert!(
                    all[prev..o]
                        .chunks(PAGE)
                        .all(|c| c == &ZERO_PAGE[..c.len()]),
                    "{what}: an untouched part does not read zero"
                );
                prev = o + PIECE;
            }
            assert!(all[prev..].chunks(PAGE).all(|c| c == &ZERO_PAGE[..c.len()]));
            unmap(at, GIB);
        }
    });
}

// ---------------------------------------------------------------------------
// Test 4: a range the application registered with its own userfaultfd.

const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFDIO_COPY: libc::c_ulong = 0xc028_aa03;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRegister {
    start: u64,
    len: u64,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// The application's own user-mode userfaultfd, or why there is none.
fn app_uffd() -> Result<libc::c_int, String> {
    // SAFETY: the syscall takes flags only.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_userfaultfd,
            libc::O_CLOEXEC | libc::O_NONBLOCK | UFFD_USER_MODE_ONLY,
        )
    };
    if fd < 0 {
        return Err(format!("userfaultfd(UFFD_USER_MODE_ONLY): {}", errno()));
    }
    let fd = fd as libc::c_int;
    let mut api = UffdioApi {
        api: UFFD_API,
        features: 0,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes a struct uffdio_api we own.
    if unsafe { libc::ioctl(fd, UFFDIO_API, &mut api) } != 0 {
        return Err(format!("UFFDIO_API: {}", errno()));
    }
    Ok(fd)
}

#[test]
fn app_registered_userfaultfd_is_left_alone() {
    in_child("app_registered_userfaultfd_is_left_alone", T, || {
        let reloc = relocation_available();
        for path in PATHS {
            let what = format!("{path:?}");
            let fd = match app_uffd() {
                Ok(fd) => fd,
                Err(why) => return missing(Need::Uffd, &why),
            };
            let len = 4 * MIB;
            let at = map(None, len, RW, 0);
            let data = pattern(len, 41);
            fill(at, &data);
            let mut reg = UffdioRegister {
                start: at as u64,
                len: len as u64,
                mode: UFFDIO_REGISTER_MODE_MISSING,
                ioctls: 0,
            };
            // SAFETY: registers a mapping of ours; the struct is ours.
            let rc = unsafe { libc::ioctl(fd, UFFDIO_REGISTER, &mut reg) };
            assert_eq!(rc, 0, "UFFDIO_REGISTER: {}", errno());
            let before = snapshot(at, len);
            assert!(before.vmas[0].has("um"), "{}", show(&before));
            let pfn_before = pfns(at, len / PAGE);

            // SAFETY: our own mapping; no fault is pending on it.
            let res = unsafe { migrate(at as *mut u8, len, node(), &opts(path)) };

            assert_same(&what, &before, &snapshot(at, len));
            assert_eq!(pfn_before, pfns(at, len / PAGE), "{what}: pages moved");
            match (path, &res) {
                (Path::Relocate, Err(MigrateError::Refused { why, .. })) => {
                    println!("NOTE: {what} -> Refused: {why}");
                    assert!(
                        matches!(why, Refusal::Flag { flag: "um", .. }),
                        "{what}: {why:?}"
                    );
                }
                (Path::Relocate, _) if !reloc => {
                    assert!(matches!(res, Err(MigrateError::Refused { .. })), "{res:?}")
                }
                (Path::Relocate, other) => panic!("{what}: must be refused, got {other:?}"),
                (_, Ok(rep)) => {
                    assert_eq!(rep.path, MigratePath::Kernel, "{what}: {rep:?}");
                    if path == Path::Auto {
                        check_report(&what, path, rep, len / PAGE);
                    }
                    println!("NOTE: {what} -> {} notes {:?}", rep.path, rep.notes);
                }
                (_, Err(e)) => panic!("{what}: {e:?}"),
            }
            assert_bytes(&what, &read_mem(at, len).unwrap(), &data);

            // The registration still works: zap a page, touch it from a
            // thread, receive the fault here and resolve it.
            let victim = at + 37 * PAGE;
            madvise(victim, PAGE, libc::MADV_DONTNEED).expect("DONTNEED");
            let reader = std::thread::spawn(move || {
                // SAFETY: a page of our mapping; the fault is resolved below.
                unsafe { (victim as *const u64).read_volatile() }
            });
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: polls our descriptor.
            let n = unsafe { libc::poll(&mut pfd, 1, 5000) };
            assert_eq!(
                n, 1,
                "{what}: no fault reached the application's userfaultfd: its registration was lost"
            );
            let mut msg = [0u8; 32];
            // SAFETY: reads one uffd_msg into our buffer.
            let r = unsafe { libc::read(fd, msg.as_mut_ptr().cast(), msg.len()) };
            assert_eq!(r, 32, "read uffd: {}", errno());
            assert_eq!(msg[0], UFFD_EVENT_PAGEFAULT);
            let addr = u64::from_ne_bytes(msg[16..24].try_into().unwrap()) as usize;
            assert_eq!(addr & !(PAGE - 1), victim);
            let src = &data[37 * PAGE..38 * PAGE];
            let mut copy = UffdioCopy {
                dst: victim as u64,
                src: src.as_ptr() as u64,
                len: PAGE as u64,
                mode: 0,
                copy: 0,
            };
            // SAFETY: copies one page of ours into the registered range.
            let rc = unsafe { libc::ioctl(fd, UFFDIO_COPY, &mut copy) };
            assert_eq!(rc, 0, "UFFDIO_COPY: {}", errno());
            let got = reader.join().unwrap();
            assert_eq!(got.to_ne_bytes(), src[..8]);
            assert_bytes(&what, &read_mem(at, len).unwrap(), &data);
            // SAFETY: our descriptor; closing it unregisters the range.
            unsafe { libc::close(fd) };
            unmap(at, len);
        }
    });
}

// ---------------------------------------------------------------------------
// Test 5: bad input on the Auto and kernel paths (the relocation path's
// basic cases are in tests/migrate.rs), plus cases no test covered yet.

#[test]
fn bad_input_is_typed_and_touches_nothing_on_every_path() {
    in_child(
        "bad_input_is_typed_and_touches_nothing_on_every_path",
        T,
        || {
            // [A: 1 MiB mapped][hole: 1 MiB][B: 1 MiB mapped]
            let res = map(None, 3 * MIB, RW, 0);
            let data = pattern(3 * MIB, 51);
            fill(res, &data);
            unmap(res + MIB, MIB);
            let hole = res + MIB;
            let check = |what: &str, before: &[Snap; 2], pfn: &Option<Vec<u64>>| {
                assert_same(what, &before[0], &snapshot(res, MIB));
                assert_same(what, &before[1], &snapshot(res + 2 * MIB, MIB));
                assert_eq!(pfn, &pfns(res, MIB / PAGE), "{what}: pages moved");
                assert_bytes(what, &read_mem(res, MIB).unwrap(), &data[..MIB]);
                assert_bytes(
                    what,
                    &read_mem(res + 2 * MIB, MIB).unwrap(),
                    &data[2 * MIB..],
                );
            };
            let before = [snapshot(res, MIB), snapshot(res + 2 * MIB, MIB)];
            let pfn = pfns(res, MIB / PAGE);
            let top = usize::MAX - PAGE + 1; // page-aligned, wraps with 2 pages
            for path in PATHS {
                let o = opts(path);
                let new_only = path == Path::Relocate;
                let cases: Vec<(&str, usize, usize, u32, MigrateOptions)> = vec![
                    ("misaligned address", res + 1, PAGE, node(), o),
                    ("misaligned length", res, PAGE + 1, node(), o),
                    ("empty", res, 0, node(), o),
                    ("no such node", res, PAGE, 9999, o),
                    ("fully unmapped", hole, MIB, node(), o),
                    ("zero channels", res, PAGE, node(), o.channels(0)),
                    ("zero batch", res, PAGE, node(), o.batch_pages(0)),
                    (
                        "folio size not a power of two",
                        res,
                        PAGE,
                        node(),
                        o.folio_size(3 * PAGE),
                    ),
                    ("wraps", top, 2 * PAGE, node(), o),
                    ("hole in the middle", res, 3 * MIB, node(), o),
                    ("runs past the end", res, 2 * MIB, node(), o),
                ];
                for (name, at, len, n, o) in cases {
                    let covered_elsewhere = matches!(
                        name,
                        "misaligned address"
                            | "misaligned length"
                            | "empty"
                            | "no such node"
                            | "fully unmapped"
                            | "zero channels"
                    );
                    if new_only && covered_elsewhere {
                        continue;
                    }
                    let what = format!("{path:?}: {name}");
                    // SAFETY: every call here is rejected before memory is used.
                    let e = unsafe { migrate(at as *mut u8, len, n, &o) }
                        .err()
                        .unwrap_or_else(|| panic!("{what}: accepted"));
                    let ok = match name {
                        "misaligned address" | "misaligned length" => {
                            matches!(e, MigrateError::Misaligned { .. })
                        }
                        "empty" => matches!(e, MigrateError::Empty),
                        "no such node" => matches!(e, MigrateError::NoSuchNode { node: 9999, .. }),
                        "fully unmapped" => {
                            matches!(e, MigrateError::Unmapped { addr } if addr == hole)
                        }
                        "zero channels" | "zero batch" | "folio size not a power of two" => {
                            matches!(e, MigrateError::ZeroBatch)
                        }
                        "wraps" => matches!(e, MigrateError::Wraps { .. }),
                        "hole in the middle" | "runs past the end" => {
                            matches!(e, MigrateError::Unmapped { addr } if addr == hole)
                        }
                        _ => unreachable!(),
                    };
                    assert!(ok, "{what}: wrong error {e:?}");
                    check(&what, &before, &pfn);
                }
            }
        },
    );
}
