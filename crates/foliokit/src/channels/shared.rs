//! The process-wide pools ([`shared`]): made on first use, kept, and fresh
//! in a forked child.

use std::sync::Arc;

use super::{ChannelError, ChannelPool};
use crate::pidlock::PidLock;

/// The shared pools of this process, by channel count.
type Pools = Vec<(usize, Arc<ChannelPool>)>;

static POOLS: PidLock<Pools> = PidLock::new();

/// This process's pools, under the lock (fresh in a forked child).
fn with_pools<R>(f: impl FnOnce(&mut Pools) -> R) -> R {
    f(POOLS.lock().get_or_insert_with(Vec::new))
}

/// The shared pools' own memory, `[lo, hi)` each: the pool, its list of
/// channels, each channel. Relocating it would leave the channels waiting
/// on a page only their own copy puts back.
pub(crate) fn shared_pool_ranges() -> Vec<(usize, usize)> {
    let range = |p: usize, n: usize| (p, p.saturating_add(n.max(1)));
    with_pools(|pools| {
        let mut out = Vec::new();
        for (_, pool) in pools.iter() {
            out.push(range(
                Arc::as_ptr(pool) as usize,
                std::mem::size_of::<ChannelPool>(),
            ));
            out.push(range(
                pool.channels.as_ptr() as usize,
                std::mem::size_of_val(pool.channels.as_slice()),
            ));
            out.extend(pool.channels.iter().map(|c| {
                range(
                    std::ptr::addr_of!(**c).cast::<u8>() as usize,
                    std::mem::size_of_val(&**c),
                )
            }));
        }
        out
    })
}

/// The process-wide CPU pool with `n` channels, created on first use and
/// kept: callers that copy or migrate repeatedly reuse the same workers
/// instead of spawning threads per call. Batches from several threads may
/// share it; each has its own completion.
///
/// Fork-safe: a child process gets pools of its own, with live workers,
/// instead of its parent's (whose threads it does not have), and does not
/// wait for the registry's lock if a parent thread held it at the fork.
pub fn shared(n: usize) -> Result<Arc<ChannelPool>, ChannelError> {
    let find = |pools: &[(usize, Arc<ChannelPool>)]| {
        pools.iter().find(|(k, _)| *k == n).map(|(_, p)| p.clone())
    };
    if let Some(p) = with_pools(|pools| find(pools)) {
        return Ok(p);
    }
    // Spawn the workers outside the lock, then publish, unless another
    // thread published first: then ours are dropped (joined), unlocked.
    let fresh = Arc::new(ChannelPool::cpu(n)?);
    let theirs = with_pools(|pools| {
        let theirs = find(pools);
        if theirs.is_none() {
            pools.push((n, fresh.clone()));
        }
        theirs
    });
    Ok(theirs.unwrap_or(fresh))
}

/// Starts the [`shared`] pool of `n` channels, and `n - 1` of the helper
/// threads that [`crate::mem::populate`] and the kernel migration path
/// share, now: afterwards, calls with at most `n` channels make no thread
/// (for a process about to forbid `clone` with seccomp, say). A helper that
/// cannot start leaves its share of that work to the calling thread.
pub fn start_shared(n: usize) -> Result<Arc<ChannelPool>, ChannelError> {
    let pool = shared(n)?;
    crate::helpers::start(n - 1);
    Ok(pool)
}

/// Forgets the [`shared`] pools: their worker threads end once the last
/// batch or caller holding a pool lets go of it; the next [`shared`] call
/// starts new ones. The helper threads of [`crate::mem::populate`] and the
/// kernel migration path end too, once they finish the work they are in.
/// For an application that wants no foliokit threads while it does
/// something else (or before it exits).
pub fn release_shared() {
    crate::helpers::release();
    let released = with_pools(std::mem::take);
    // Dropped outside the lock: the last drop joins the workers.
    drop(released);
}

/// Runs `f` while holding the locks of the [`shared`] pools and of the
/// helper threads: a test hook, for forking while another thread holds
/// them. `f` must not call [`shared`], populate or migrate itself (it would
/// wait for its own thread forever).
#[doc(hidden)]
pub fn hold_shared_lock<R>(f: impl FnOnce() -> R) -> R {
    let _pools = POOLS.lock();
    let _helpers = crate::helpers::hold_lock();
    f()
}
