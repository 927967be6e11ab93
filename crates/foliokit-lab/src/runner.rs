//! The lab run: every seed experiment, in order, with sizes for the scale
//! asked (smoke, quick, full). This is where the experiments' shapes for
//! `foliokit lab` are decided; the CLI runs the steps in order, renders
//! each and keeps the results.

use foliokit::strategy::{parse_list, Strategy};
use foliokit::{ClearStrategy, CopyStrategy, Reuse};
use std::time::Duration;

use crate::copy_clear::{ClearBench, CopyBench, StrategyPlan};
use crate::fault::FaultPlan;
use crate::init::InitPlan;
use crate::measure::CacheMode;
use crate::migrate::MigratePlan;
use crate::remap::RemapPlan;
use crate::restore::RestorePlan;
use crate::units::{approx_size, show_size};
use crate::LabError;

const K: usize = 1 << 10;
const M: usize = 1 << 20;
const G: usize = 1 << 30;

/// How large the lab's experiments are.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scale {
    /// Tiny sizes, seconds long: for testing the report itself.
    Smoke,
    /// About 3 minutes on 2 vCPUs.
    Quick,
    /// Sizes like the seeds', scaled down where memory does not allow them.
    Full,
}

impl Scale {
    pub fn name(self) -> &'static str {
        match self {
            Scale::Smoke => "smoke",
            Scale::Quick => "quick",
            Scale::Full => "full",
        }
    }
}

/// One experiment of the lab, planned.
pub enum Experiment {
    Copy(CopyBench, StrategyPlan<CopyStrategy>),
    Clear(ClearBench, StrategyPlan<ClearStrategy>),
    Fault(FaultPlan),
    Init(InitPlan),
    Migrate(MigratePlan),
    Mremap(RemapPlan),
    Restore(RestorePlan),
}

/// A step of the lab run: what it is called and which seed it reproduces.
pub struct Step {
    /// The file stem of its CSV and its anchor on the page.
    pub key: &'static str,
    pub heading: &'static str,
    pub seed: &'static str,
    pub experiment: Experiment,
}

/// Folio sizes, channel counts and cache mode of a copy or clear step.
struct Shape {
    folios: Vec<usize>,
    channels: Vec<usize>,
    cache: CacheMode,
}

/// A copy or clear plan for the strategies `spec` names.
fn strategy_plan<S: Strategy>(
    spec: &str,
    size: usize,
    loops: usize,
    shape: Shape,
) -> Result<StrategyPlan<S>, LabError> {
    Ok(StrategyPlan {
        selection: parse_list::<S>(spec)?,
        size,
        folio_sizes: shape.folios,
        loops,
        channels: shape.channels,
        reuse: Reuse::Reread,
        limits: true,
        cache: shape.cache,
    })
}

/// The lab's steps at `scale`, with `available` bytes of memory free;
/// `notes` says where a seed's size had to be scaled down.
pub fn steps(
    scale: Scale,
    available: usize,
    notes: &mut Vec<String>,
) -> Result<Vec<Step>, LabError> {
    let (size, folios, loops) = match scale {
        Scale::Smoke => (16 * M, vec![4 * K, 2 * M], 1),
        Scale::Quick => (256 * M, vec![4 * K, 64 * K, 2 * M], 3),
        Scale::Full => (G, vec![4 * K, 16 * K, 64 * K, 256 * K, M, 2 * M, G], 5),
    };
    let strategies = |folios: &[usize], channels: &[usize], cache| Shape {
        folios: folios.to_vec(),
        channels: channels.to_vec(),
        cache,
    };
    let fault_size = match scale {
        Scale::Smoke => 64 * M,
        Scale::Quick => G,
        Scale::Full => {
            let fit = (available / 2 / G * G).max(G);
            if fit < 64 * G {
                notes.push(format!(
                    "fault: the seed's 64G region scaled down to {} ({} available)",
                    show_size(fit),
                    approx_size(available)
                ));
            }
            fit.min(64 * G)
        }
    };
    let (init_size, init_loops) = match scale {
        Scale::Smoke => (16 * M, 2),
        Scale::Quick => (256 * M, 6),
        Scale::Full => (G, 30),
    };
    let (mig_size, mig_pages, batches, mig_loops) = match scale {
        Scale::Smoke => (16 * M, vec![2 * M], vec![512, 2048], 1),
        // Three runs: the fewest from which the summary judges noise.
        Scale::Quick => (
            256 * M,
            vec![4 * K, 64 * K, 2 * M],
            vec![512, 2048, 8192, 65536],
            3,
        ),
        Scale::Full => (
            G,
            vec![4 * K, 16 * K, 64 * K, 256 * K, M, 2 * M],
            vec![
                512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144,
            ],
            3,
        ),
    };
    let (iterations, remap_loops) = match scale {
        Scale::Smoke => (200, 1),
        Scale::Quick => (2000, 3),
        Scale::Full => (10_000, 5),
    };
    let (restore_size, restore_loops) = match scale {
        Scale::Smoke => (32 * M, 1),
        Scale::Quick => (256 * M, 8),
        Scale::Full => (4 * G, 8),
    };
    let step = |key, heading, seed, experiment| Step {
        key,
        heading,
        seed,
        experiment,
    };
    Ok(vec![
        step(
            "copy",
            "Folio copy (seed 000)",
            "000",
            // Seed 000's method: the source is evicted before every loop.
            Experiment::Copy(
                CopyBench { mc: false },
                strategy_plan(
                    "all",
                    size,
                    loops,
                    strategies(&folios, &[1, 2], CacheMode::Evict),
                )?,
            ),
        ),
        step(
            "copy-mc",
            "Machine-check-safe copy (seed 000)",
            "000",
            Experiment::Copy(
                CopyBench { mc: true },
                strategy_plan(
                    "movsb,avx2,nt,auto",
                    size,
                    loops,
                    strategies(&[2 * M], &[1], CacheMode::Evict),
                )?,
            ),
        ),
        step(
            "clear",
            "Huge-page clearing (seed 002)",
            "002",
            Experiment::Clear(
                ClearBench { hint_page: 0 },
                strategy_plan(
                    "all",
                    size,
                    loops,
                    strategies(&folios, &[1, 2], CacheMode::Hot),
                )?,
            ),
        ),
        step(
            "fault",
            "Demand faults and prefault (seed 002)",
            "002",
            Experiment::Fault(FaultPlan {
                size: fault_size,
                page: if scale == Scale::Full {
                    vec![4 * K, 2 * M, G]
                } else {
                    vec![4 * K, 2 * M]
                },
                function: vec!["demand".into(), "populate".into()],
                loops,
                random: false,
                threads: vec![1, 2],
                limits: true,
            }),
        ),
        step(
            "init",
            "Write-once initialisation (seed 003)",
            "003",
            Experiment::Init(InitPlan {
                size: init_size,
                record: 64,
                function: "all".into(),
                loops: init_loops,
                limits: true,
            }),
        ),
        step(
            "migrate",
            "Batched migration with copy channels (seed 001)",
            "001",
            Experiment::Migrate(MigratePlan {
                size: mig_size,
                page: mig_pages,
                channels: vec![1, 2],
                table_batch: 8192,
                batch: batches,
                loops: mig_loops,
                latency_budget: (scale != Scale::Smoke).then(|| Duration::from_millis(1)),
                tables: vec![1, 2, 3, 4],
                node: None,
                from: None,
                path: foliokit::migrate::Path::Relocate,
            }),
        ),
        step(
            "mremap",
            "mremap of large folios (seed 004)",
            "004",
            Experiment::Mremap(RemapPlan {
                iterations,
                loops: remap_loops,
                align: scale != Scale::Smoke,
            }),
        ),
        step(
            "restore",
            "Guest RAM restore: eager vs lazy (seed 001's latency/throughput trade-off)",
            "001",
            Experiment::Restore(RestorePlan {
                size: restore_size,
                channels: 2,
                loops: restore_loops,
                cold: false,
                // Whole microseconds, as `bench restore --budget-us` takes it.
                budget: Duration::from_micros(
                    foliokit::tune::LAZY_LATENCY_BUDGET.as_micros() as u64
                ),
                dir: std::env::temp_dir(),
                serve_during_batches: false,
                hugetlb: false,
                zero_fraction: 0.0,
                dense_zeros: false,
                // The seeds have no external handler; `bench restore` has
                // those rows.
                vmm_exe: None,
                vmm_wait: None,
                handler_block: foliokit::lazy::firecracker::BLOCK,
            }),
        ),
    ])
}
