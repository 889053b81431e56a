//! The kernel build: every `cuda/*.cu` is compiled and embedded for the
//! default architectures (asserted when `CI` is set, where scripts/test.sh
//! installs nvcc), and without a usable GPU asking for one is a clear error.

use asrforge::backend::cuda;
use asrforge::{Device, Error};
use std::path::{Path, PathBuf};

/// Where a staged copy keeps what it needs: scripts/gpu-check.sh stages
/// this binary as `.device/tests/cuda_build`, the kernel sources' names in
/// `.device/cuda/` and the CLI as `.device/bin/asrforge`. `None` when this
/// binary is not in such a layout (a run on the build machine).
fn staged_root() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let root = exe.parent()?.parent()?.to_path_buf();
    (exe.parent()?.file_name()? == "tests" && root.join("cuda").is_dir()).then_some(root)
}

/// The folder of the kernel sources: the staged copy's on a GPU host, else
/// the build tree's (the build machine's path does not exist elsewhere).
fn cuda_dir() -> PathBuf {
    match staged_root() {
        Some(root) => root.join("cuda"),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda"),
    }
}

/// The asrforge binary: the staged one next to a staged copy, else cargo's.
fn asrforge_bin() -> PathBuf {
    match staged_root() {
        Some(root) => root.join("bin").join("asrforge"),
        None => PathBuf::from(env!("CARGO_BIN_EXE_asrforge")),
    }
}

fn cu_stems() -> Vec<String> {
    let dir = cuda_dir();
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn every_kernel_file_is_embedded_in_ci() {
    let stems = cu_stems();
    let embedded: Vec<String> = cuda::kernels_embedded().iter().map(|s| s.to_string()).collect();
    println!("cuda/*.cu: {stems:?} (in {})\nembedded: {embedded:?} for archs {:?}", cuda_dir().display(), cuda::archs());
    assert!(!stems.is_empty(), "cuda/ holds no .cu file");
    if std::env::var_os("CI").is_none() {
        println!("CI is not set: not requiring the kernels to be embedded");
        return;
    }
    assert!(cfg!(feature = "cuda"), "CI builds with the default `cuda` feature");
    assert_eq!(embedded, stems, "every cuda/*.cu must be compiled and embedded");
    if std::env::var_os("CUDA_ARCHS").is_none() {
        assert_eq!(cuda::archs(), "80,90", "default architectures");
    }
}

#[test]
fn no_gpu_is_a_clear_error_or_a_working_device() {
    match Device::cuda(0) {
        Ok(d) => {
            println!("GPU present: {d:?}");
            assert!(Device::available().contains(&Device::Cuda(0)));
        }
        Err(Error::CudaUnavailable(msg)) => {
            println!("no GPU: {msg}");
            assert!(msg.contains("cuda:0"), "the message names the device: {msg}");
            assert!(!Device::available().contains(&Device::Cuda(0)));
            let e = Device::parse("cuda:3").unwrap_err().to_string();
            assert!(e.contains("cuda:3"), "{e}");
        }
        Err(e) => panic!("expected CudaUnavailable, got {e}"),
    }
}

#[test]
fn info_prints_the_kernels_and_the_driver_state() {
    let bin = asrforge_bin();
    let out = std::process::Command::new(&bin).arg("info").output().unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "asrforge info failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with(&format!("asrforge {}", env!("CARGO_PKG_VERSION"))), "{text}");
    let embedded = cuda::kernels_embedded();
    if embedded.is_empty() {
        assert!(text.contains("kernels: none embedded"), "{text}");
    } else {
        let line = format!("kernels: {} modules embedded: {}", embedded.len(), embedded.join(", "));
        assert!(text.contains(&line), "expected {line:?} in:\n{text}");
        let n = cuda::kernels::resources().count();
        let line = text.lines().find(|l| l.starts_with("ptxas report")).unwrap_or_else(|| panic!("no ptxas line in:\n{text}"));
        assert!(line.contains(&format!("{n} kernel builds")), "{line}");
    }
    if cfg!(feature = "cuda") {
        let driver = text.lines().find(|l| l.starts_with("CUDA driver:")).unwrap_or_else(|| panic!("no driver line in:\n{text}"));
        match cuda::device_count() {
            // The emulated device (ASRFORGE_CUDA_EMU=1) is named as such, never as a GPU.
            Ok(_) if cuda::emulation_requested() => assert!(text.contains("GPUs: cuda:0 is EMULATED on the CPU"), "{text}"),
            // No driver here: the line says why.
            Err(_) => assert!(driver.contains("not found") || driver.contains("failed"), "{driver}"),
            Ok(n) => assert!(text.contains(&format!("GPUs: {n} visible")), "{text}"),
        }
        for lib in ["cuBLAS:", "cuBLASLt:", "NVRTC:", "NCCL:"] {
            assert!(text.lines().any(|l| l.starts_with(lib) && (l.contains("found"))), "{lib} line missing in:\n{text}");
        }
    }
}

/// A copy staged the way scripts/gpu-check.sh stages it, run from another
/// folder: it reads the staged sources and binary, not the build tree's
/// (which a GPU host does not have). The staged `cuda/` here names one
/// kernel file fewer than the tree, so reading the tree's would show.
#[test]
fn a_staged_copy_reads_its_own_files_not_the_build_trees() {
    if staged_root().is_some() {
        println!("running as a staged copy already: nothing to stage");
        return;
    }
    let root = std::env::temp_dir().join(format!("asrforge-staged-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for d in ["tests", "cuda", "bin"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let tree = cu_stems();
    assert!(tree.len() >= 2, "cuda/ holds {tree:?}");
    let staged = &tree[1..];
    for s in staged {
        std::fs::write(root.join("cuda").join(format!("{s}.cu")), "").unwrap();
    }
    let exe = root.join("tests").join("cuda_build");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_asrforge"), root.join("bin").join("asrforge")).unwrap();
    let elsewhere = std::env::temp_dir();
    let run = |filter: &str| {
        let out = std::process::Command::new(&exe).args([filter, "--exact", "--nocapture"]).current_dir(&elsewhere).env_remove("CI").output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    };
    let (ok, text) = run("every_kernel_file_is_embedded_in_ci");
    assert!(ok, "the staged build test failed:\n{text}");
    let want = format!("cuda/*.cu: {staged:?} (in {})", root.join("cuda").display());
    assert!(text.contains(&want), "expected {want:?} in:\n{text}");
    let (ok, text) = run("info_prints_the_kernels_and_the_driver_state");
    assert!(ok, "the staged info test failed:\n{text}");
    std::fs::remove_dir_all(&root).unwrap();
}

/// The nvcc that scripts/install-nvcc.sh installs: ptxas's figures below
/// (which kernels spill, and by how much) are its own, so they are required
/// exactly only from it; another nvcc has them printed.
const PINNED_NVCC: &str = "V13.0.88";

/// Kernels that spill registers with the pinned nvcc, and the bytes it
/// reports (arch, stores, loads). The wide wmma dQ kernel in bf16 runs only
/// at head dims 80 to 128 (d_k 64 and below run attention_*_wmma64, which
/// does not spill); a spill anywhere else is a regression, and an entry
/// that stops spilling leaves this list.
const KNOWN_SPILLS: &[(&str, u32, u32, u32)] = &[("attention_bwd_dq_wmma_bf16", 80, 8, 12), ("attention_bwd_dq_wmma_bf16", 90, 32, 68)];

/// ptxas's report, which build.rs asks for (`-Xptxas -v`): a row for every
/// kernel of every embedded module on every arch; no spill outside
/// KNOWN_SPILLS (pinned nvcc); and the reason the wmma64 attention set
/// exists: on sm_90 each of its kernels fits more blocks per SM than the
/// wide set's.
#[test]
fn ptxas_reports_every_kernel_and_no_unlisted_spill() {
    let rows: Vec<_> = cuda::kernels::resources().collect();
    let embedded = cuda::kernels_embedded();
    if embedded.is_empty() {
        assert!(std::env::var_os("CI").is_none(), "CI embeds the kernels, so ptxas reports them");
        println!("no kernels embedded: no ptxas report to check");
        return;
    }
    let archs: Vec<u32> = cuda::archs().split(',').map(|a| a.parse().expect("arch list")).collect();
    let mut n = 0;
    for (module, kernel, _) in cuda::kernels::SIGNATURES.iter().filter(|(m, _, _)| embedded.contains(m)) {
        for &arch in &archs {
            let r = rows.iter().find(|r| r.module == *module && r.kernel == *kernel && r.arch == arch);
            let r = r.unwrap_or_else(|| panic!("ptxas reported nothing for {module}/{kernel} on sm_{arch}"));
            assert!(r.registers > 0, "{r:?}");
            n += 1;
        }
    }
    assert_eq!(n, rows.len(), "one report row per kernel and arch, and no other");
    let version = cuda::kernels::NVCC_VERSION;
    let spills: Vec<_> = rows.iter().filter(|r| r.spill_stores + r.spill_loads > 0).collect();
    println!("nvcc {version}: {} rows, spilling: {spills:?}", rows.len());
    if version != PINNED_NVCC {
        println!("nvcc {version} is not the pinned {PINNED_NVCC}: spills printed, not required");
        return;
    }
    for r in &spills {
        let known = KNOWN_SPILLS.iter().find(|(k, a, _, _)| *k == r.kernel && *a == r.arch);
        let &(_, _, st, ld) = known.unwrap_or_else(|| {
            panic!("{} on sm_{} spills ({} B stored, {} B loaded): a register spill nothing lists", r.kernel, r.arch, r.spill_stores, r.spill_loads)
        });
        assert!(r.spill_stores <= st && r.spill_loads <= ld, "{r:?}: spills more than the {st} / {ld} B listed");
    }
    for &(k, a, _, _) in KNOWN_SPILLS.iter().filter(|(_, a, _, _)| archs.contains(a)) {
        assert!(spills.iter().any(|r| r.kernel == k && r.arch == a), "{k} on sm_{a} no longer spills: take it out of KNOWN_SPILLS");
    }
    if archs.contains(&90) {
        for dt in ["f16", "bf16"] {
            for k in ["attention_fwd", "attention_bwd_dq", "attention_bwd_dkv"] {
                let of = |set: &str| cuda::kernels::resources_of(&format!("{k}_{set}_{dt}"), 90).unwrap_or_else(|| panic!("{k}_{set}_{dt} on sm_90"));
                let (wide, narrow) = (of("wmma"), of("wmma64"));
                let (bw, bn) = (wide.blocks_per_sm(128).unwrap(), narrow.blocks_per_sm(128).unwrap());
                println!(
                    "{k} {dt} sm_90: wmma {} regs {} B smem {bw} blocks/SM; wmma64 {} regs {} B smem {bn} blocks/SM",
                    wide.registers, wide.smem, narrow.registers, narrow.smem
                );
                assert!(narrow.registers < wide.registers && narrow.smem < wide.smem, "{k} {dt}: {narrow:?} vs {wide:?}");
                assert!(bn > bw, "{k} {dt}: wmma64 fits {bn} blocks per SM, the wide set {bw}");
            }
        }
    }
}

/// The occupancy arithmetic against the guide's rules worked by hand: 168
/// registers x 32 lanes = 5376 (a multiple of 256) per warp, 21504 per
/// 4-warp block, 65536 / 21504 = 3 blocks; 29056 B of shared memory + 1 KiB
/// reserved = 30080, 233472 / 30080 = 7 blocks; so registers bind at 3.
#[test]
fn blocks_per_sm_follows_the_registers_shared_memory_and_warp_limits() {
    let r = |registers, smem, arch| cuda::kernels::Resources { module: "m", kernel: "k", arch, registers, smem, spill_stores: 0, spill_loads: 0 };
    assert_eq!(r(168, 29056, 90).blocks_per_sm(128), Some(3));
    // 100 registers: 3200 per warp, rounded up to 3328; 4 warps 13312; 65536 / 13312 = 4.
    assert_eq!(r(100, 0, 90).blocks_per_sm(128), Some(4));
    // Shared memory binds: 45568 + 1024 = 46592; 233472 / 46592 = 5 on sm_90, 167936 / 46592 = 3 on sm_80.
    assert_eq!(r(32, 45568, 90).blocks_per_sm(128), Some(5));
    assert_eq!(r(32, 45568, 80).blocks_per_sm(128), Some(3));
    // Warps bind: 16 registers, 1024 threads = 32 warps; 64 / 32 = 2 (registers would allow 4).
    assert_eq!(r(16, 0, 90).blocks_per_sm(1024), Some(2));
    // Blocks bind: 32-thread blocks of few registers stop at 32 per SM (16 on sm_86).
    assert_eq!(r(16, 0, 90).blocks_per_sm(32), Some(32));
    assert_eq!(r(16, 0, 86).blocks_per_sm(32), Some(16));
    assert_eq!(r(16, 0, 75).blocks_per_sm(32), None);
    // More threads than an SM holds: none fit, and nothing overflows.
    assert_eq!(r(16, 0, 90).blocks_per_sm(4096), Some(0));
    assert_eq!(r(u32::MAX, u32::MAX, 90).blocks_per_sm(u32::MAX), Some(0));
}
