//! Build script: compiles every `cuda/*.cu` with nvcc into one fatbin per
//! file (machine code for each arch in `CUDA_ARCHS`, default `80,90`, plus
//! PTX for the lowest arch so newer GPUs can JIT it) and writes
//! `$OUT_DIR/kernels.rs`, which embeds them with `include_bytes!`.
//!
//! Without the `cuda` feature it does nothing. Without nvcc it warns and
//! embeds no kernels; the CUDA backend then refuses to start and says how to
//! install nvcc. An nvcc error fails the build with nvcc's own messages.

use std::path::{Path, PathBuf};
use std::process::Command;

const ENV_VARS: [&str; 6] = ["NVCC", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_ARCHS", "PATH"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    for v in ENV_VARS {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let src_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("cuda");
    println!("cargo:rerun-if-changed={}", src_dir.display());
    let mut sources = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&src_dir) {
        for e in rd.flatten() {
            let p = e.path();
            match p.extension().and_then(|x| x.to_str()) {
                Some("cu") => {
                    println!("cargo:rerun-if-changed={}", p.display());
                    sources.push(p);
                }
                Some("cuh") => println!("cargo:rerun-if-changed={}", p.display()),
                _ => {}
            }
        }
    }
    sources.sort();
    let archs = parse_archs();
    let arch_list = archs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",");
    let nvcc = match find_nvcc() {
        Some(n) => n,
        None => {
            println!(
                "cargo:warning=asrforge: nvcc not found (looked at NVCC, CUDA_HOME/CUDA_PATH/CUDA_ROOT + /bin/nvcc, PATH); building without CUDA kernels. Install it with scripts/install-nvcc.sh"
            );
            write_index(&out_dir, &[], "");
            return;
        }
    };
    let handles: Vec<_> = sources
        .iter()
        .map(|src| {
            let (nvcc, src, out_dir, src_dir, archs) = (nvcc.clone(), src.clone(), out_dir.clone(), src_dir.clone(), archs.clone());
            std::thread::spawn(move || compile(&nvcc, &src, &src_dir, &out_dir, &archs))
        })
        .collect();
    let mut built = Vec::new();
    let mut failures = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(entry)) => built.push(entry),
            Ok(Err(msg)) => failures.push(msg),
            Err(_) => failures.push("an nvcc worker thread panicked".to_string()),
        }
    }
    if !failures.is_empty() {
        eprintln!("{}", failures.join("\n\n"));
        panic!("nvcc failed on {} kernel file(s); its messages are above", failures.len());
    }
    built.sort();
    write_index(&out_dir, &built, &arch_list);
}

/// The architectures to compile for (`CUDA_ARCHS="80,90"`), lowest first.
fn parse_archs() -> Vec<u32> {
    let raw = std::env::var("CUDA_ARCHS").unwrap_or_else(|_| "80,90".to_string());
    let mut v: Vec<u32> = raw
        .split(',')
        .map(|s| s.trim().trim_start_matches("sm_").trim_start_matches("compute_"))
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or_else(|_| panic!("CUDA_ARCHS: expected a comma list of numbers like 80,90, got {raw:?}")))
        .collect();
    v.sort_unstable();
    v.dedup();
    if v.is_empty() {
        panic!("CUDA_ARCHS: expected a comma list of numbers like 80,90, got {raw:?}");
    }
    v
}

fn find_nvcc() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NVCC") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Some(p);
        }
        println!("cargo:warning=asrforge: NVCC={} is not a file; looking elsewhere", p.display());
    }
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Some(root) = std::env::var_os(var) {
            let p = PathBuf::from(root).join("bin").join("nvcc");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("nvcc")).find(|p| p.is_file())
}

/// Compiles one `.cu` into `$OUT_DIR/<stem>.fatbin`; returns (stem, path).
fn compile(nvcc: &Path, src: &Path, src_dir: &Path, out_dir: &Path, archs: &[u32]) -> Result<(String, PathBuf), String> {
    let stem = src.file_stem().and_then(|s| s.to_str()).ok_or_else(|| format!("{}: not a UTF-8 file name", src.display()))?.to_string();
    let out = out_dir.join(format!("{stem}.fatbin"));
    let text = std::fs::read_to_string(src).map_err(|e| format!("{}: {e}", src.display()))?;
    let fast_math = text.lines().take(5).any(|l| l.trim() == "// nvcc: --use_fast_math");
    let mut cmd = Command::new(nvcc);
    cmd.args(["-fatbin", "-std=c++17", "-O3"]);
    for a in archs {
        cmd.arg("-gencode").arg(format!("arch=compute_{a},code=sm_{a}"));
    }
    let low = archs[0];
    cmd.arg("-gencode").arg(format!("arch=compute_{low},code=compute_{low}"));
    if fast_math {
        cmd.arg("--use_fast_math");
    }
    cmd.arg(format!("-I{}", src_dir.display()));
    if let Some(bin) = nvcc.parent() {
        for inc in ["../include", "../include/cccl"] {
            let d = bin.join(inc);
            if d.is_dir() {
                cmd.arg(format!("-I{}", d.display()));
            }
        }
    }
    cmd.arg("-o").arg(&out).arg(src);
    let res = cmd.output().map_err(|e| format!("cannot run {}: {e}", nvcc.display()))?;
    if !res.status.success() {
        return Err(format!(
            "nvcc failed on {} ({}):\n{}{}",
            src.display(),
            res.status,
            String::from_utf8_lossy(&res.stdout),
            String::from_utf8_lossy(&res.stderr)
        ));
    }
    Ok((stem, out))
}

fn write_index(out_dir: &Path, built: &[(String, PathBuf)], archs: &str) {
    let mut s = String::from("/// Embedded kernel modules: (file stem, fatbin).\npub static KERNELS: &[(&str, &[u8])] = &[\n");
    for (stem, path) in built {
        s.push_str(&format!("    ({stem:?}, include_bytes!({:?})),\n", path.display().to_string()));
    }
    s.push_str("];\n");
    s.push_str(&format!("/// The architectures the kernels were compiled for (`80,90`), empty without nvcc.\npub static ARCHS: &str = {archs:?};\n"));
    let emu = out_dir.join("emu");
    s.push_str(&format!(
        "/// Where the emulated kernel modules are.\npub const EMU_DIR: &str = {:?};\n/// The emulated modules built.\npub const EMU_MODULES: &[&str] = &[];\n/// Why none was built.\npub const EMU_PROBLEM: &str = \"this build.rs does not build the emulated modules yet\";\n",
        emu.display().to_string()
    ));
    let dst = out_dir.join("kernels.rs");
    std::fs::write(&dst, s).unwrap_or_else(|e| panic!("cannot write {}: {e}", dst.display()));
}
