//! Explicit start-up: `init` does everything foliokit does to the process,
//! once, and after it the hot path leaves the filesystem alone. Each test
//! runs in its own process: `init` is once per process.

#![cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]

mod common;

use common::in_child;
use foliokit::mem::Region;
use foliokit::tune::{Profile, ProfileError};
use foliokit::{
    clear_folios, copy_folios, init, ChannelCpus, ClearOptions, Config, CopyOptions, CopyStrategy,
    InitError, ProfileChoice,
};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

#[test]
fn a_second_init_is_refused_and_changes_nothing() {
    in_child("a_second_init_is_refused_and_changes_nothing", T, || {
        let first = init(Config::new()).expect("first init");
        assert!(!first.profile.loaded, "no profile was asked for");
        let again = init(Config::new().profile(ProfileChoice::DefaultFile));
        assert!(matches!(again, Err(InitError::AlreadyInitialized)));
        assert!(!foliokit::tune::profile_status().loaded);
    });
}

#[test]
fn a_plain_copy_before_init_leaves_init_possible() {
    in_child("a_plain_copy_before_init_leaves_init_possible", T, || {
        let mut d = Region::new(8192, 4096).unwrap();
        let s = Region::new(8192, 4096).unwrap();
        copy_folios(d.as_mut_slice(), s.as_slice(), 4096, CopyOptions::default()).unwrap();
        init(Config::new().channel_cpus(ChannelCpus::Spread))
            .expect("nothing depended on the config yet");
    });
}

#[test]
fn channels_started_before_init_fix_the_defaults() {
    in_child("channels_started_before_init_fix_the_defaults", T, || {
        foliokit::channels::shared(1).unwrap();
        let r = init(Config::new().channel_cpus(ChannelCpus::Spread));
        assert!(matches!(r, Err(InitError::AlreadyInitialized)), "{r:?}");
    });
}

#[test]
fn a_profile_for_another_cpu_is_refused() {
    in_child("a_profile_for_another_cpu_is_refused", T, || {
        let p = Profile {
            version: foliokit::tune::PROFILE_VERSION,
            cpu_model: "a CPU that is not this one".into(),
            choices: vec![],
            unsettled: vec![],
        };
        let r = init(Config::new().profile(ProfileChoice::Given(p)));
        assert!(
            matches!(r, Err(InitError::Profile(ProfileError::OtherCpu { .. }))),
            "{r:?}"
        );
        assert!(!foliokit::tune::profile_status().loaded);
        // Refused before anything was set up: the application may retry.
        init(Config::new()).expect("init after a refused profile");
    });
}

/// `auto` reads a table resolved when a profile is put in force: a cell
/// steers the matching shape (and only it), and putting the built-in rules
/// back in force restores their choice.
#[test]
fn a_profile_put_in_force_steers_auto_and_can_be_taken_back() {
    in_child(
        "a_profile_put_in_force_steers_auto_and_can_be_taken_back",
        T,
        || {
            use foliokit::tune::{choose_copy, use_profile, Choice, FolioClass, Regime, Shape};
            let shape = Shape::batch(2 << 20, 2, foliokit::Reuse::Reread);
            let builtin = choose_copy(shape);
            // A strategy every CPU has, and not the rules' choice here.
            let other = if builtin == CopyStrategy::Libc {
                CopyStrategy::PerPage
            } else {
                CopyStrategy::Libc
            };
            let p = Profile {
                version: foliokit::tune::PROFILE_VERSION,
                cpu_model: foliokit::cpu::cpu().model.clone(),
                choices: vec![Choice {
                    op: "copy".into(),
                    regime: Regime::Resident,
                    class: FolioClass::Large,
                    channels: 1,
                    strategy: other.to_string(),
                    gbps: 1.0,
                }],
                unsettled: vec![],
            };
            assert!(use_profile(Some(p), "test").unwrap().loaded);
            assert_eq!(choose_copy(shape), other);
            assert_eq!(
                choose_copy(shape.on_channels(2)),
                builtin,
                "an unmeasured channel count follows the rules"
            );
            assert!(!use_profile(None, "test").unwrap().loaded);
            assert_eq!(choose_copy(shape), builtin);
        },
    );
}

#[cfg(feature = "serde")]
#[test]
fn a_missing_profile_file_is_an_error_when_asked_for_by_name() {
    in_child(
        "a_missing_profile_file_is_an_error_when_asked_for_by_name",
        T,
        || {
            let r = init(
                Config::new().profile(ProfileChoice::File("/nonexistent/profile.json".into())),
            );
            assert!(
                matches!(r, Err(InitError::Profile(ProfileError::Read { .. }))),
                "{r:?}"
            );
            init(Config::new()).expect("init after a missing profile file");
        },
    );
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_refused_sigbus_handler_makes_mc_copies_unavailable() {
    in_child(
        "a_refused_sigbus_handler_makes_mc_copies_unavailable",
        T,
        || {
            init(Config::new().sigbus_handler(false)).unwrap();
            let mut d = [0u8; 64];
            let r = foliokit::copy_mc(&mut d, &[3u8; 64], CopyStrategy::Auto);
            assert!(matches!(r, Err(foliokit::McError::Unavailable(_))), "{r:?}");
            assert_eq!(
                foliokit::handler_state(),
                foliokit::HandlerState::NotInstalled
            );
        },
    );
}

#[cfg(target_arch = "x86_64")]
#[test]
fn a_handler_installed_after_foliokit_is_detected_and_mc_copies_refuse() {
    in_child(
        "a_handler_installed_after_foliokit_is_detected_and_mc_copies_refuse",
        T,
        || {
            init(Config::new()).unwrap();
            assert_eq!(foliokit::handler_state(), foliokit::HandlerState::Installed);
            let mut d = [0u8; 64];
            foliokit::copy_mc(&mut d, &[3u8; 64], CopyStrategy::Auto).unwrap();
            extern "C" fn theirs(_: libc::c_int) {}
            // SAFETY: a one-argument handler that does nothing; no SIGBUS
            // is raised in this process after it.
            unsafe { common::set_handler(libc::SIGBUS, theirs as *const () as usize, 0) };
            assert_eq!(foliokit::handler_state(), foliokit::HandlerState::Replaced);
            let r = foliokit::copy_mc(&mut d, &[4u8; 64], CopyStrategy::Auto);
            assert!(
                matches!(r, Err(foliokit::McError::HandlerReplaced)),
                "{r:?}"
            );
            assert_eq!(d, [3u8; 64], "nothing was copied");
        },
    );
}

#[test]
fn channels_run_on_the_cpus_the_application_chose() {
    in_child("channels_run_on_the_cpus_the_application_chose", T, || {
        // The first CPU this process may use (CPU 0 may be outside its set).
        // SAFETY: cpu_set_t is plain data; zeroed is an empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: writes only `set`.
        let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
        assert_eq!(rc, 0);
        let first = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: indices below CPU_SETSIZE.
            .find(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .expect("some CPU");
        init(Config::new().channel_cpus(ChannelCpus::Cpus(vec![first]))).unwrap();
        let pool = foliokit::channels::shared(2).unwrap();
        assert_eq!(pool.len(), 2);
        // Every worker of the pool is pinned to that CPU: read the affinity
        // of the process's threads named foliokit-cpu*. Workers name and
        // pin themselves as they start, so look until both have.
        let workers = || {
            let mut found = Vec::new();
            for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
                let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                if !comm.starts_with("foliokit-cpu") {
                    continue;
                }
                let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
                let allowed = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .map(|l| l.trim().to_string())
                    .unwrap_or_default();
                found.push((comm.trim().to_string(), allowed));
            }
            found
        };
        let start = std::time::Instant::now();
        let mut found = workers();
        while !(found.len() >= 2 && found.iter().all(|(_, a)| *a == first.to_string()))
            && start.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(10));
            found = workers();
        }
        assert!(found.len() >= 2, "channel workers: {found:?}");
        let want = first.to_string();
        assert!(found.iter().all(|(_, a)| *a == want), "{found:?}");
        foliokit::channels::release_shared();
    });
}

/// Installs, on every thread of the process (TSYNC: the channel workers
/// too), a seccomp filter that kills the process on any call that names a
/// file by path: after `init`, copies, clears, mc copies and channel
/// batches must not need one. (`fstat` on an open descriptor stays allowed:
/// it reads no file.)
#[cfg(target_arch = "x86_64")]
fn forbid_files() {
    common::seccomp_filter(
        &[
            libc::SYS_open,
            libc::SYS_openat,
            libc::SYS_openat2,
            libc::SYS_creat,
            libc::SYS_stat,
            libc::SYS_lstat,
            libc::SYS_access,
            libc::SYS_faccessat,
            libc::SYS_faccessat2,
            libc::SYS_readlink,
            libc::SYS_readlinkat,
        ],
        common::SeccompAction::KillProcess,
    );
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_file_filter_kills_a_process_that_opens_a_file() {
    // The filter is what the next test relies on: show it bites.
    in_child(
        "the_file_filter_kills_a_process_that_opens_a_file",
        T,
        || {
            if std::env::var("FOLIOKIT_FILTER_PROBE").is_ok() {
                forbid_files();
                let _ = std::fs::read_to_string("/proc/self/status");
                std::process::exit(0);
            }
            let exe = std::env::current_exe().unwrap();
            let status = std::process::Command::new(exe)
                .args([
                    "the_file_filter_kills_a_process_that_opens_a_file",
                    "--exact",
                    "--test-threads=1",
                ])
                .env("FOLIOKIT_FILTER_PROBE", "1")
                .env(
                    common::CHILD_ENV,
                    "the_file_filter_kills_a_process_that_opens_a_file",
                )
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap();
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(libc::SIGSYS), "{status:?}");
        },
    );
}

#[cfg(target_arch = "x86_64")]
#[test]
fn after_init_the_hot_path_opens_no_file() {
    in_child("after_init_the_hot_path_opens_no_file", T, || {
        init(Config::new().start_channels(2)).unwrap();
        // Everything the operations below allocate is allocated first.
        let mut src_region = Region::new(8 << 20, 2 << 20).unwrap();
        let mut dst_region = Region::new(8 << 20, 2 << 20).unwrap();
        let src = src_region.as_mut_slice();
        let dst = dst_region.as_mut_slice();
        src.fill(7);
        forbid_files();
        for strategy in [CopyStrategy::Auto, CopyStrategy::Nt, CopyStrategy::Libc] {
            let o = CopyOptions::default().strategy(strategy);
            copy_folios(dst, src, 2 << 20, o).unwrap();
        }
        foliokit::copy_mc(&mut dst[..4096], &src[..4096], CopyStrategy::Auto).unwrap();
        clear_folios(src, 2 << 20, ClearOptions::default()).unwrap();
        let pool = foliokit::channels::shared(2).unwrap();
        let f = CopyStrategy::Movsb.function().unwrap();
        let dsts: Vec<*mut u8> = dst.chunks_mut(2 << 20).map(|c| c.as_mut_ptr()).collect();
        let srcs: Vec<*const u8> = src.chunks(2 << 20).map(|c| c.as_ptr()).collect();
        // SAFETY: each pair is a disjoint 2 MiB folio of our own buffers.
        unsafe { pool.copy_folios(&dsts, &srcs, 2 << 20, f) }.unwrap();
        assert!(dst.iter().all(|&b| b == 0));
        println!("after_init_the_hot_path_opens_no_file: copy, copy_mc, clear and a channel batch ran with every thread (workers too) under a filter that kills any call naming a file by path");
    });
}

/// Without the `serde` feature the file choices still exist, and `init`
/// refuses them before taking the configuration, so it can be called again.
#[cfg(not(feature = "serde"))]
#[test]
fn profile_files_need_the_serde_feature() {
    in_child("profile_files_need_the_serde_feature", T, || {
        for choice in [
            ProfileChoice::File("/nonexistent/profile.json".into()),
            ProfileChoice::DefaultFile,
        ] {
            let r = init(Config::new().profile(choice));
            assert!(
                matches!(r, Err(InitError::Profile(ProfileError::FilesNeedSerde))),
                "{r:?}"
            );
        }
        init(Config::new()).expect("the refusal left init possible");
    });
}
