//! Build script: compiles every `cuda/*.cu` with nvcc into one fatbin per
//! file (machine code for each arch in `CUDA_ARCHS`, default `80,90`, plus
//! PTX for the lowest arch so newer GPUs can JIT it) and writes
//! `$OUT_DIR/kernels.rs`, which embeds them with `include_bytes!`.
//!
//! With the `cuda` feature it also compiles every `cuda/*.cu`, unchanged, with
//! g++ >= 12 (`CXX`) and the CUDA-on-CPU runtime of `cuda/emu/` into
//! `$OUT_DIR/emu/lib<stem>.so` (`EMU_DIR`, `EMU_MODULES`, `EMU_PROBLEM` in
//! kernels.rs; no nvcc needed). A missing g++ warns; a g++ error fails the build.
//!
//! Without the `cuda` feature it does nothing. Without nvcc it warns and
//! embeds no kernels; the CUDA backend then refuses to start and says how to
//! install nvcc. An nvcc error fails the build with nvcc's own messages.

use std::path::{Path, PathBuf};
use std::process::Command;

const ENV_VARS: [&str; 7] = ["NVCC", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_ARCHS", "PATH", "CXX"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
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
    // The typed launch functions (src/backend/cuda/kernels.rs), with or
    // without the `cuda` feature: every wrapper calls them.
    let scans = scan_all(&src_dir, &sources);
    write_bindings(&out_dir, &scans);
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let emu = build_emu(&out_dir, &src_dir, &sources, &scans);
    let archs = parse_archs();
    let arch_list = archs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",");
    let nvcc = match find_nvcc() {
        Some(n) => n,
        None => {
            println!(
                "cargo:warning=asrforge: nvcc not found (looked at NVCC, CUDA_HOME/CUDA_PATH/CUDA_ROOT + /bin/nvcc, PATH); building without CUDA kernels. Install it with scripts/install-nvcc.sh"
            );
            write_index(&out_dir, &[], "", "", &emu, &scans);
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
    built.sort_by(|a, b| a.0.cmp(&b.0));
    // nvcc's version ("V13.0.88"): ptxas's report depends on it.
    let version = Command::new(&nvcc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().find(|w| w.starts_with('V')).map(str::to_string))
        .unwrap_or_default();
    write_index(&out_dir, &built, &arch_list, &version, &emu, &scans);
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

/// One compiled module: its stem, its fatbin, and what ptxas reported for
/// each kernel and arch.
type Built = (String, PathBuf, Vec<Resources>);

/// ptxas's resource report for one kernel on one arch (`-Xptxas -v`):
/// registers per thread, static shared memory, and the bytes spilled to and
/// reloaded from local memory.
#[derive(Clone, Debug, PartialEq)]
struct Resources {
    kernel: String,
    arch: u32,
    registers: u32,
    smem: u32,
    spill_stores: u32,
    spill_loads: u32,
}

/// Compiles one `.cu` into `$OUT_DIR/<stem>.fatbin` with ptxas's report.
fn compile(nvcc: &Path, src: &Path, src_dir: &Path, out_dir: &Path, archs: &[u32]) -> Result<Built, String> {
    let stem = src.file_stem().and_then(|s| s.to_str()).ok_or_else(|| format!("{}: not a UTF-8 file name", src.display()))?.to_string();
    let out = out_dir.join(format!("{stem}.fatbin"));
    let text = std::fs::read_to_string(src).map_err(|e| format!("{}: {e}", src.display()))?;
    let fast_math = text.lines().take(5).any(|l| l.trim() == "// nvcc: --use_fast_math");
    let mut cmd = Command::new(nvcc);
    cmd.args(["-fatbin", "-std=c++17", "-O3", "-Xptxas", "-v"]);
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
    let report = format!("{}{}", String::from_utf8_lossy(&res.stdout), String::from_utf8_lossy(&res.stderr));
    // A report this parser cannot read is a warning, not a failed build: the
    // kernels are good, only their figures are missing (tests/cuda_build.rs
    // then names a kernel without them).
    let resources = parse_ptxas(&report).unwrap_or_else(|e| {
        println!("cargo:warning=asrforge: {}: cannot read ptxas's report ({e}); its kernels have no resource figures", src.display());
        Vec::new()
    });
    Ok((stem, out, resources))
}

/// The entries of ptxas's `-v` report, which for each kernel and arch reads
///   ptxas info    : Compiling entry function 'k' for 'sm_90'
///   ptxas info    : Function properties for k
///       16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
///   ptxas info    : Used 96 registers, used 1 barriers, ..., 21888 bytes smem
/// (no smem figure when there is none; device functions that are not
/// entries have their own properties lines, which are skipped).
fn parse_ptxas(report: &str) -> Result<Vec<Resources>, String> {
    // The number just before `unit` in `text` ("32 bytes spill stores").
    fn before(text: &str, unit: &str) -> Option<u32> {
        let head = &text[..text.find(unit)?];
        head.trim_end().rsplit([' ', ',']).next()?.parse().ok()
    }
    let mut out = Vec::new();
    let mut cur: Option<Resources> = None;
    let mut props_of_entry = false;
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let (kernel, tail) = rest.split_once('\'').ok_or_else(|| format!("unexpected line {line:?}"))?;
            let arch = tail.split("'sm_").nth(1).and_then(|a| a.trim_end_matches('\'').parse().ok()).ok_or_else(|| format!("no arch in {line:?}"))?;
            if let Some(r) = cur.take() {
                return Err(format!("no register count for {} (sm_{})", r.kernel, r.arch));
            }
            cur = Some(Resources { kernel: kernel.to_string(), arch, registers: 0, smem: 0, spill_stores: 0, spill_loads: 0 });
        } else if let Some(name) = line.split("Function properties for ").nth(1) {
            props_of_entry = cur.as_ref().is_some_and(|r| r.kernel == name.trim());
        } else if line.contains("spill stores") {
            if props_of_entry {
                let r = cur.as_mut().expect("properties of the current entry");
                r.spill_stores = before(line, " bytes spill stores").ok_or_else(|| format!("unexpected line {line:?}"))?;
                r.spill_loads = before(line, " bytes spill loads").ok_or_else(|| format!("unexpected line {line:?}"))?;
            }
            props_of_entry = false;
        } else if line.contains("Used ") && line.contains(" registers") {
            if let Some(mut r) = cur.take() {
                r.registers = line
                    .split("Used ")
                    .nth(1)
                    .and_then(|t| t.split(' ').next())
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| format!("unexpected line {line:?}"))?;
                r.smem = before(line, " bytes smem").unwrap_or(0);
                out.push(r);
            }
        }
    }
    match cur {
        Some(r) => Err(format!("no register count for {} (sm_{})", r.kernel, r.arch)),
        None => Ok(out),
    }
}

fn write_index(out_dir: &Path, built: &[Built], archs: &str, nvcc_version: &str, emu: &EmuBuild, scans: &[(String, CuScan)]) {
    let mut s = String::from("/// Embedded kernel modules: (file stem, fatbin).\npub static KERNELS: &[(&str, &[u8])] = &[\n");
    for (stem, path, _) in built {
        s.push_str(&format!("    ({stem:?}, include_bytes!({:?})),\n", path.display().to_string()));
    }
    s.push_str("];\n");
    s.push_str(&format!("/// The architectures the kernels were compiled for (`80,90`), empty without nvcc.\npub static ARCHS: &str = {archs:?};\n"));
    s.push_str(&format!(
        "/// Where the emulated modules lib<stem>.so are (ASRFORGE_EMU_DIR overrides it at run time).\npub const EMU_DIR: &str = {:?};\n",
        emu.dir.display().to_string()
    ));
    s.push_str(&format!("/// The stems of the emulated modules built (empty without g++ >= 12).\npub const EMU_MODULES: &[&str] = &{:?};\n", emu.modules));
    s.push_str(&format!("/// Why no emulated module was built, or \"\".\npub const EMU_PROBLEM: &str = {:?};\n", emu.problem));
    s.push_str("/// Every kernel's parameter kinds from its `extern \"C\" __global__` signature: (module stem, kernel,\n/// one code per parameter: `i` const pointer, `o` pointer, `4`/`8` integer, `f` float, `d` double, `s` struct),\n/// sorted (the C side of the typed bindings: see `kernels::tests`).\npub static SIGNATURES: &[(&str, &str, &str)] = &[\n");
    let mut sigs: Vec<(&str, &str, &str)> =
        scans.iter().flat_map(|(stem, sc)| sc.signatures.iter().map(move |k| (stem.as_str(), k.name.as_str(), k.codes.as_str()))).collect();
    sigs.sort();
    for (stem, k, codes) in sigs {
        s.push_str(&format!("    ({stem:?}, {k:?}, {codes:?}),\n"));
    }
    s.push_str("];\n");
    s.push_str(&format!(
        "/// The version of the nvcc that compiled the kernels (`V13.0.88`), empty without nvcc.\npub static NVCC_VERSION: &str = {nvcc_version:?};\n"
    ));
    s.push_str("/// ptxas's report for every compiled kernel and arch: (module stem, kernel, arch, registers per thread,\n/// static shared memory bytes, spill store bytes, spill load bytes), sorted (see `kernels::resources`).\npub static RESOURCES: &[(&str, &str, u32, u32, u32, u32, u32)] = &[\n");
    let mut res: Vec<(&str, &Resources)> = built.iter().flat_map(|(stem, _, rs)| rs.iter().map(move |r| (stem.as_str(), r))).collect();
    res.sort_by(|a, b| (a.0, a.1.kernel.as_str(), a.1.arch).cmp(&(b.0, b.1.kernel.as_str(), b.1.arch)));
    for (stem, r) in res {
        s.push_str(&format!("    ({stem:?}, {:?}, {}, {}, {}, {}, {}),\n", r.kernel, r.arch, r.registers, r.smem, r.spill_stores, r.spill_loads));
    }
    s.push_str("];\n");
    let dst = out_dir.join("kernels.rs");
    std::fs::write(&dst, s).unwrap_or_else(|e| panic!("cannot write {}: {e}", dst.display()));
}

// ---- the emulated modules (cuda/emu, see cuda/README.md) --------------------------------

/// What the emulated build produced: the stems built, and why none were, if so.
struct EmuBuild {
    dir: PathBuf,
    modules: Vec<String>,
    problem: String,
}

/// Compiles every `cuda/<stem>.cu`, unchanged, with g++ and the force-included
/// `cuda/emu/emu.h` into `$OUT_DIR/emu/lib<stem>.so` (kernel table generated
/// from `g++ -E`, runtime from `cuda/emu/runtime.cpp`). A missing or old g++
/// warns and builds none; a g++ error fails the build with g++'s messages.
fn build_emu(out_dir: &Path, src_dir: &Path, sources: &[PathBuf], scans: &[(String, CuScan)]) -> EmuBuild {
    let dir = out_dir.join("emu");
    let none = |problem: String| {
        println!("cargo:warning=asrforge: {problem}; the emulated CUDA device (ASRFORGE_CUDA_EMU=1) is unavailable");
        EmuBuild { dir: dir.clone(), modules: Vec::new(), problem }
    };
    let cxx = std::env::var_os("CXX").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("g++"));
    let version = match Command::new(&cxx).arg("-dumpversion").output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        Ok(o) => return none(format!("{} -dumpversion failed ({})", cxx.display(), o.status)),
        Err(e) => return none(format!("no C++ compiler for the emulated kernels ({}: {e}; set CXX to a g++ >= 12)", cxx.display())),
    };
    let major: u32 = version.split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
    if major < 12 {
        return none(format!("{} is version {version:?}; the emulated kernels need g++ >= 12 (set CXX)", cxx.display()));
    }
    if let Err(e) = std::fs::create_dir_all(&dir) {
        panic!("cannot create {}: {e}", dir.display());
    }
    let emu_src = src_dir.join("emu");
    // The runtime (every cuda/emu/*.cpp), compiled once and linked into every module.
    let mut runtime_objs = Vec::new();
    let mut jobs = Vec::new();
    let mut rt_sources: Vec<PathBuf> = std::fs::read_dir(&emu_src)
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "cpp")).collect())
        .unwrap_or_default();
    rt_sources.sort();
    for src in rt_sources {
        let stem = src.file_stem().and_then(|s| s.to_str()).unwrap_or("runtime").to_string();
        let obj = dir.join(format!("rt_{stem}.o"));
        runtime_objs.push(obj.clone());
        let (cxx, emu_src) = (cxx.clone(), emu_src.clone());
        jobs.push(std::thread::spawn(move || {
            let mut cmd = emu_cxx(&cxx, &emu_src);
            cmd.arg("-c").arg("-o").arg(&obj).arg(&src);
            run_cxx(cmd, &src.display().to_string()).map(|_| None)
        }));
    }
    // The project's modules, plus test-only kernels (tests/emu_runtime.rs) in emu/testdata.
    let mut units: Vec<(PathBuf, PathBuf, Option<CuScan>)> = sources.iter().zip(scans).map(|(s, (_, sc))| (s.clone(), dir.clone(), Some(sc.clone()))).collect();
    let test_dir = dir.join("testdata");
    if let Ok(rd) = std::fs::read_dir(emu_src.join("testdata")) {
        if let Err(e) = std::fs::create_dir_all(&test_dir) {
            panic!("cannot create {}: {e}", test_dir.display());
        }
        let mut extra: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "cu")).collect();
        extra.sort();
        units.extend(extra.into_iter().map(|p| (p, test_dir.clone(), None)));
    }
    for (src, out, scan) in units {
        let (cxx, emu_src, src_dir) = (cxx.clone(), emu_src.clone(), src_dir.to_path_buf());
        jobs.push(std::thread::spawn(move || emu_module(&cxx, &emu_src, &src_dir, &out, &src, scan).map(|stem| Some((stem, out)))));
    }
    let mut built = Vec::new();
    let mut failures = Vec::new();
    for j in jobs {
        match j.join() {
            Ok(Ok(Some(b))) => built.push(b),
            Ok(Ok(None)) => {}
            Ok(Err(msg)) => failures.push(msg),
            Err(_) => failures.push("a g++ worker thread panicked".to_string()),
        }
    }
    if !failures.is_empty() {
        eprintln!("{}", failures.join("\n\n"));
        panic!("g++ failed on {} emulated kernel file(s); its messages are above", failures.len());
    }
    let links: Vec<_> = built
        .iter()
        .map(|(stem, out)| {
            let (cxx, out, rt, stem) = (cxx.clone(), out.clone(), runtime_objs.clone(), stem.clone());
            std::thread::spawn(move || {
                let mut cmd = Command::new(&cxx);
                cmd.args(["-shared", "-fPIC", "-o"]).arg(out.join(format!("lib{stem}.so"))).arg(out.join(format!("{stem}.o"))).args(&rt);
                cmd.args(["-ldl", "-lpthread"]);
                run_cxx(cmd, &format!("lib{stem}.so"))
            })
        })
        .collect();
    for l in links {
        match l.join() {
            Ok(Ok(())) => {}
            Ok(Err(msg)) => failures.push(msg),
            Err(_) => failures.push("a linker thread panicked".to_string()),
        }
    }
    if !failures.is_empty() {
        eprintln!("{}", failures.join("\n\n"));
        panic!("linking {} emulated kernel module(s) failed; the messages are above", failures.len());
    }
    let mut stems: Vec<String> = built.into_iter().filter(|(_, out)| *out == dir).map(|(stem, _)| stem).collect();
    stems.sort();
    EmuBuild { dir, modules: stems, problem: String::new() }
}

/// g++ with the emulated build's flags: C++17, -O2, position independent, only
/// the ABI exported, no FMA contraction (see cuda/README.md).
fn emu_cxx(cxx: &Path, emu_src: &Path) -> Command {
    let mut cmd = Command::new(cxx);
    cmd.args(["-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-fno-extern-tls-init", "-ffp-contract=off", "-fno-math-errno", "-w"]);
    cmd.arg(format!("-I{}", emu_src.display()));
    cmd
}

fn run_cxx(mut cmd: Command, what: &str) -> Result<(), String> {
    let res = cmd.output().map_err(|e| format!("cannot run {:?} for {what}: {e}", cmd.get_program()))?;
    if !res.status.success() {
        return Err(format!("g++ failed on {what} ({}):\n{}{}", res.status, String::from_utf8_lossy(&res.stdout), String::from_utf8_lossy(&res.stderr)));
    }
    Ok(())
}

/// `src` preprocessed by `cxx -E` with the emulator's headers and
/// `ASRFORGE_EMU_SCAN` (`__global__`/`__shared__` left visible); any g++
/// version does, since nothing is compiled.
fn preprocess(cxx: &Path, emu_src: &Path, src_dir: &Path, src: &Path) -> Result<String, String> {
    let mut pre = emu_cxx(cxx, emu_src);
    pre.args(["-E", "-P", "-x", "c++", "-DASRFORGE_EMU_SCAN"]);
    pre.arg("-include").arg(emu_src.join("emu.h"));
    pre.arg(format!("-I{}", src_dir.display())).arg(format!("-I{}", emu_src.join("include").display()));
    pre.arg(src);
    let res = pre.output().map_err(|e| format!("cannot run {}: {e}", cxx.display()))?;
    if !res.status.success() {
        return Err(format!("{} -E failed on {} ({}):\n{}", cxx.display(), src.display(), res.status, String::from_utf8_lossy(&res.stderr)));
    }
    Ok(String::from_utf8_lossy(&res.stdout).into_owned())
}

/// Writes the table `<stem>_emu.cpp` of `src` (scanning it unless `scan` is
/// given) and compiles it to `<stem>.o`.
fn emu_module(cxx: &Path, emu_src: &Path, src_dir: &Path, dir: &Path, src: &Path, scan: Option<CuScan>) -> Result<String, String> {
    let stem = src.file_stem().and_then(|s| s.to_str()).ok_or_else(|| format!("{}: not a UTF-8 file name", src.display()))?.to_string();
    let scan = match scan {
        Some(s) => s,
        None => scan_cu(&preprocess(cxx, emu_src, src_dir, src)?),
    };
    let table = dir.join(format!("{stem}_emu.cpp"));
    std::fs::write(&table, emu_table(src, &scan)).map_err(|e| format!("cannot write {}: {e}", table.display()))?;
    let mut cmd = emu_cxx(cxx, emu_src);
    cmd.args(["-x", "c++"]);
    cmd.arg("-include").arg(emu_src.join("emu.h"));
    cmd.arg(format!("-I{}", src_dir.display())).arg(format!("-I{}", emu_src.join("include").display()));
    cmd.arg("-c").arg("-o").arg(dir.join(format!("{stem}.o"))).arg(&table);
    run_cxx(cmd, &src.display().to_string())?;
    Ok(stem)
}

/// What the table needs from one preprocessed `.cu`.
#[derive(Default, Clone)]
struct CuScan {
    /// `extern "C" __global__` functions: (namespace path, name).
    kernels: Vec<(Vec<String>, String)>,
    /// Each kernel's signature, in file order.
    signatures: Vec<KernelSig>,
    /// `extern __shared__` arrays: (namespace path, element type, name).
    shared: Vec<(Vec<String>, String, String)>,
}

/// Lists the kernels and dynamic shared arrays of preprocessed C++ (string and
/// character literals skipped; namespaces tracked; "" is an anonymous one).
fn scan_cu(text: &str) -> CuScan {
    #[derive(Clone)]
    enum Brace {
        Ns(String),
        ExternC,
        Other,
    }
    let b = text.as_bytes();
    let mut out = CuScan::default();
    let mut stack: Vec<Brace> = Vec::new();
    let mut pending_ns: Option<String> = None;
    let mut prev_ident = String::new();
    let mut i = 0;
    let ident = |i: usize| -> usize {
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        j
    };
    let ns_path = |stack: &[Brace]| -> Vec<String> { stack.iter().filter_map(|x| if let Brace::Ns(n) = x { Some(n.clone()) } else { None }).collect() };
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' {
            let mut j = i + 1;
            while j < b.len() && b[j] != c {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            i = j + 1;
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            let j = ident(i);
            let word = &text[i..j];
            if prev_ident == "namespace" {
                pending_ns = Some(word.to_string());
            } else if word == "namespace" {
                pending_ns = Some(String::new());
            }
            let in_extern_c = matches!(stack.last(), Some(Brace::ExternC));
            if word == "__global__" && (in_extern_c || text[..i].trim_end().ends_with("extern \"C\"")) {
                if let Some(p) = text[j..].find('(') {
                    let head = text[j..j + p].trim_end();
                    let name: String =
                        head.chars().rev().take_while(|ch| ch.is_ascii_alphanumeric() || *ch == '_').collect::<Vec<_>>().into_iter().rev().collect();
                    let path = ns_path(&stack);
                    if !name.is_empty() && !out.kernels.iter().any(|(_, n)| *n == name) {
                        let params = text[j + p + 1..].find(')').map(|close| &text[j + p + 1..j + p + 1 + close]).unwrap_or("");
                        out.signatures.push(KernelSig { name: name.clone(), codes: signature_codes(params), params: split_params(params) });
                        out.kernels.push((path, name));
                    }
                }
            }
            if word == "__shared__" && prev_ident == "extern" {
                if let Some(p) = text[j..].find('[') {
                    let decl = strip_attrs(&text[j..j + p]);
                    let decl = decl.trim();
                    let split = decl.rfind(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_')).map(|k| k + 1).unwrap_or(0);
                    let (ty, name) = (decl[..split].trim().to_string(), decl[split..].to_string());
                    let path = ns_path(&stack);
                    if !name.is_empty() && !out.shared.iter().any(|(p2, _, n)| *n == name && *p2 == path) {
                        out.shared.push((path, ty, name));
                    }
                }
            }
            prev_ident = word.to_string();
            i = j;
            continue;
        }
        match c {
            b'{' => {
                let brace = match pending_ns.take() {
                    Some(ns) => Brace::Ns(ns),
                    None if text[..i].trim_end().ends_with("extern \"C\"") => Brace::ExternC,
                    None => Brace::Other,
                };
                stack.push(brace)
            }
            b'}' => {
                stack.pop();
            }
            b';' | b'=' => pending_ns = None,
            b':' if pending_ns.is_some() => {}
            _ => {}
        }
        if !c.is_ascii_whitespace() && c != b':' {
            prev_ident.clear();
        }
        i += 1;
    }
    out
}

/// The kinds of a kernel's parameters (the text between its parentheses,
/// preprocessed), one code each: `i` a pointer to const (read), `o` a pointer
/// to non-const (written), `4`/`8` a 4/8-byte integer, `f` float, `d` double,
/// `s` a struct passed by value (shapes, strides).
fn signature_codes(params: &str) -> String {
    split_params(params).iter().map(|p| param_code(p)).collect()
}

/// The parameter declarations of a kernel (the text between its parentheses), trimmed.
fn split_params(params: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, ch) in params.char_indices() {
        match ch {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&params[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&params[start..]);
    parts.into_iter().map(str::trim).filter(|p| !p.is_empty() && *p != "void").map(str::to_string).collect()
}

/// The code of one parameter declaration (`const float* __restrict__ x`, `uint32_t n`).
fn param_code(decl: &str) -> char {
    if let Some(star) = decl.rfind('*') {
        let before = &decl[..star];
        let is_const = before.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).any(|w| w == "const");
        return if is_const { 'i' } else { 'o' };
    }
    // The type is every word but the last (the parameter's name).
    let words: Vec<&str> = decl.split_whitespace().filter(|w| !matches!(*w, "const" | "__restrict__" | "__restrict")).collect();
    let ty = words[..words.len().saturating_sub(1)].join(" ");
    match ty.as_str() {
        "double" | "acc_t<double>" => 'd',
        "float" => 'f',
        t if t.starts_with("acc_t<") => 'f',
        "int" | "unsigned" | "unsigned int" | "int32_t" | "uint32_t" | "i32" | "u32" => '4',
        "long long" | "unsigned long long" | "long" | "unsigned long" | "int64_t" | "uint64_t" | "i64" | "u64" | "size_t" => '8',
        _ => 's',
    }
}

/// `decl` without `__align__(..)`, `alignas(..)` and `__attribute__((..))`.
fn strip_attrs(decl: &str) -> String {
    let mut s = decl.to_string();
    for kw in ["__align__", "alignas", "__attribute__"] {
        while let Some(k) = s.find(kw) {
            let open = match s[k..].find('(') {
                Some(o) => k + o,
                None => break,
            };
            let mut depth = 0;
            let mut end = open;
            for (off, ch) in s[open..].char_indices() {
                if ch == '(' {
                    depth += 1;
                } else if ch == ')' {
                    depth -= 1;
                    if depth == 0 {
                        end = open + off + 1;
                        break;
                    }
                }
            }
            s.replace_range(k..end, " ");
        }
    }
    s
}

/// The generated table of one module: the `.cu` itself, a definition of each
/// `extern __shared__` array, the kernel trampolines.
fn emu_table(src: &Path, scan: &CuScan) -> String {
    let open = |path: &[String]| path.iter().map(|n| format!("namespace {n} {{ ")).collect::<String>();
    let close = |path: &[String]| "} ".repeat(path.len());
    let qual = |path: &[String], name: &str| {
        if path.iter().any(|n| n.is_empty()) {
            name.to_string()
        } else {
            path.iter().map(|n| format!("::{n}")).collect::<String>() + "::" + name
        }
    };
    let mut s =
        format!("// Generated by build.rs: the emulated module of {}.\n#include {:?}\n#include \"table.h\"\n\n", src.display(), src.display().to_string());
    for (path, ty, name) in &scan.shared {
        s.push_str(&format!(
            "{}alignas(16) thread_local {ty} {name}[(::asrforge_emu::kDynSharedCap + ::asrforge_emu::kDynGuard) / sizeof({ty})]; {}\n",
            open(path),
            close(path)
        ));
    }
    // The sizes the typed bindings pass (`&[u64; N]`, STRUCTS), checked against the C structs.
    let mut checked = Vec::new();
    for k in &scan.signatures {
        for (p, c) in k.params.iter().zip(k.codes.chars()) {
            let ty = decl_type(p);
            if let (true, Some((_, w, _))) = (c == 's', STRUCTS.iter().find(|(n, _, _)| *n == ty)) {
                if !checked.contains(&ty) {
                    s.push_str(&format!("static_assert(sizeof({ty}) == {w} * 8, \"build.rs STRUCTS says {ty} is {w} words\");\n"));
                    checked.push(ty);
                }
            }
        }
    }
    s.push_str("\nnamespace asrforge_emu {\nthread_local char tls_anchor_byte;\nvoid* tls_anchor() { return &tls_anchor_byte; }\n");
    s.push_str("const KernelEntry kKernels[] = {\n");
    for (path, name) in &scan.kernels {
        s.push_str(&format!("    {{\"{name}\", &tramp<&{}>}},\n", qual(path, name)));
    }
    s.push_str(&format!("    {{nullptr, nullptr}},\n}};\nconst size_t kKernelCount = {};\n", scan.kernels.len()));
    for (k, (path, _, name)) in scan.shared.iter().enumerate() {
        s.push_str(&format!("static void* dyn_shared_{k}() {{ return (void*)&{}; }}\n", qual(path, name)));
    }
    s.push_str("void* (*const kDynShared[])() = {");
    for k in 0..scan.shared.len() {
        s.push_str(&format!("dyn_shared_{k}, "));
    }
    s.push_str(&format!("nullptr}};\nconst size_t kDynSharedCount = {};\n}}  // namespace asrforge_emu\n", scan.shared.len()));
    s
}

// ---- the typed launch functions (src/backend/cuda/kernels.rs) ---------------------------

/// One `extern "C" __global__` kernel as scanned: its name, parameter codes
/// (`param_code`) and parameter declarations.
#[derive(Clone)]
struct KernelSig {
    name: String,
    codes: String,
    params: Vec<String>,
}

/// The structs kernels take by value: (C name, size in 64-bit words,
/// whether it carries buffer pointers the profile cannot see). The Rust
/// side passes `&[u64; words]`; the emulated build checks each size with a
/// `static_assert` (a kernel taking a struct not listed here fails the build).
const STRUCTS: &[(&str, usize, bool)] = &[
    ("Bcast", 25, false),
    ("Bcast32", 25, false),
    ("CastHead", 4, true),
    ("CastTable", 450, true),
    ("FastDiv", 2, false),
    ("MtHead", 5, true),
    ("Strided", 17, false),
    ("Strided32", 21, false),
];

/// The dtype words of kernel names (`DType::as_str`) and their `DType`.
const DTYPE_WORDS: &[(&str, &str)] = &[("f32", "F32"), ("f64", "F64"), ("f16", "F16"), ("bf16", "BF16"), ("i64", "I64"), ("u8", "U8")];

/// Scans every `cuda/*.cu` (preprocessed by `CXX`, else `g++`/`c++`/`clang++`):
/// (stem, scan) in file order. No preprocessor fails the build: the typed
/// launch functions are made from the scan.
fn scan_all(src_dir: &Path, sources: &[PathBuf]) -> Vec<(String, CuScan)> {
    let emu_src = src_dir.join("emu");
    let candidates: Vec<PathBuf> = match std::env::var_os("CXX") {
        Some(c) => vec![PathBuf::from(c)],
        None => ["g++", "c++", "clang++"].iter().map(PathBuf::from).collect(),
    };
    let cxx = candidates.iter().find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success())).cloned().unwrap_or_else(|| {
        panic!("asrforge: no C++ preprocessor found (tried {candidates:?}); the typed kernel bindings are generated from `g++ -E` of cuda/*.cu (any g++ or clang++ version; set CXX)")
    });
    let jobs: Vec<_> = sources
        .iter()
        .map(|src| {
            let (cxx, emu_src, src_dir, src) = (cxx.clone(), emu_src.clone(), src_dir.to_path_buf(), src.clone());
            std::thread::spawn(move || {
                let stem = src.file_stem().and_then(|s| s.to_str()).ok_or_else(|| format!("{}: not a UTF-8 file name", src.display()))?.to_string();
                preprocess(&cxx, &emu_src, &src_dir, &src).map(|text| (stem, scan_cu(&text)))
            })
        })
        .collect();
    let mut out = Vec::new();
    let mut failures = Vec::new();
    for j in jobs {
        match j.join() {
            Ok(Ok(s)) => out.push(s),
            Ok(Err(msg)) => failures.push(msg),
            Err(_) => failures.push("a scanning thread panicked".to_string()),
        }
    }
    if !failures.is_empty() {
        eprintln!("{}", failures.join("\n\n"));
        panic!("scanning {} kernel file(s) for the typed bindings failed; the messages are above", failures.len());
    }
    out
}

/// One parameter of a kernel, as the generated function takes it.
#[derive(Clone, PartialEq)]
struct RustParam {
    name: String,
    /// The Rust type in the generated function's signature.
    ty: String,
    /// How the argument is packed: `ptr`, `int` (its own type), `acc` (an
    /// f64 packed as the kernel's float or double), `words`.
    pack: &'static str,
    /// A by-value table carrying buffer pointers (its bytes come as `moved`).
    carries: bool,
}

/// The C type of a declaration (every word but the name, qualifiers dropped).
fn decl_type(decl: &str) -> String {
    let d = decl.replace('*', " * ");
    let words: Vec<&str> = d.split_whitespace().filter(|w| !matches!(*w, "const" | "__restrict__" | "__restrict")).collect();
    words[..words.len().saturating_sub(1)].join(" ")
}

/// The `DType` of a pointer's element type, if it has one.
fn pointee_dtype(decl: &str) -> Option<&'static str> {
    let ty = decl_type(decl).replace(" *", "").replace('*', "");
    let ty = ty.trim();
    Some(match ty {
        "float" => "F32",
        "double" | "acc_t<double>" => "F64",
        "f16" | "__half" | "half" => "F16",
        "bf16" | "__nv_bfloat16" => "BF16",
        "i64" | "u64" | "int64_t" | "uint64_t" | "long long" | "unsigned long long" => "I64",
        "uint8_t" | "unsigned char" | "u8" => "U8",
        t if t.starts_with("acc_t<") => "F32",
        _ => return None,
    })
}

/// The declared parameter name, made a valid Rust identifier that does not
/// clash with the generated function's own parameters.
fn rust_name(decl: &str, i: usize) -> String {
    let d = decl.replace('*', " ");
    let n = d.split_whitespace().last().unwrap_or("").to_string();
    const TAKEN: &[&str] = &[
        "dev", "dt", "dt_to", "cfg", "moved", "k", "params", "bufs", "type", "in", "ref", "mod", "fn", "loop", "match", "move", "impl", "self", "use", "where",
        "as", "box", "const", "crate", "dyn", "enum", "extern", "false", "true", "for", "if", "else", "let", "mut", "pub", "return", "static", "struct",
        "super", "trait", "unsafe", "while", "yield", "async", "await", "abstract", "final", "override", "macro", "priv", "try", "typeof", "virtual",
    ];
    if n.is_empty() || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || n.starts_with(|c: char| c.is_ascii_digit()) {
        format!("arg{i}")
    } else if TAKEN.contains(&n.as_str()) || n.starts_with('a') && n[1..].parse::<u32>().is_ok() {
        format!("{n}_")
    } else {
        n
    }
}

fn rust_param(decl: &str, code: char, i: usize, kernel: &str) -> RustParam {
    let name = rust_name(decl, i);
    let ty = decl_type(decl);
    let mut carries = false;
    let (ty, pack): (String, &'static str) = match code {
        'i' | 'o' => ("&CudaStorage".into(), "ptr"),
        '4' | '8' => {
            let unsigned = ty.contains("unsigned") || ty.starts_with('u') || ty == "size_t";
            let bits = if code == '4' { 32 } else { 64 };
            (format!("{}{bits}", if unsigned { 'u' } else { 'i' }), "int")
        }
        'f' | 'd' if ty.starts_with("acc_t<") => ("f64".into(), "acc"),
        'f' => ("f32".into(), "int"),
        'd' => ("f64".into(), "int"),
        _ => {
            let st = STRUCTS
                .iter()
                .find(|(n, _, _)| *n == ty)
                .unwrap_or_else(|| panic!("asrforge: kernel {kernel} takes a `{ty}` by value; add its size in 64-bit words to STRUCTS in build.rs"));
            carries = st.2;
            (format!("&[u64; {}]", st.1), "words")
        }
    };
    RustParam { name, ty, pack, carries }
}

/// A kernel name's family and dtypes: the dtype words removed, except one
/// right after a `to` word when there is another (`sum_rows_bf16_to_f32` is
/// `sum_rows_to_f32` of bf16; `rows_to_f32` is `rows_to` of f32).
fn split_family(name: &str) -> (String, Vec<&'static str>) {
    let words: Vec<&str> = name.split('_').collect();
    let n_dts = words.iter().filter(|w| DTYPE_WORDS.iter().any(|(s, _)| s == *w)).count();
    let mut keep = Vec::new();
    let mut dts = Vec::new();
    for (i, w) in words.iter().enumerate() {
        match DTYPE_WORDS.iter().find(|(s, _)| s == w) {
            Some((_, d)) if n_dts == 1 || i == 0 || words[i - 1] != "to" => dts.push(*d),
            _ => keep.push(*w),
        }
    }
    (keep.join("_"), dts)
}

/// Writes `$OUT_DIR/bindings.rs`: `KERNEL_TABLE` (every kernel: module, name,
/// codes, the dtype of each pointer) and, per `.cu` module, one launch function
/// per kernel family, the dtype(s) choosing the instantiation. A family whose
/// instantiations differ in their parameters gets one function per kernel.
fn write_bindings(out_dir: &Path, scans: &[(String, CuScan)]) {
    use std::fmt::Write;
    let mut table = String::new();
    let mut modules = String::new();
    let mut check = String::new();
    let mut id = 0usize;
    for (stem, scan) in scans {
        // (family, [(kernel index, dtypes, sig)]) in file order.
        let mut families: Vec<(String, Vec<Member>)> = Vec::new();
        for k in &scan.signatures {
            let (fam, dts) = split_family(&k.name);
            let ptr_dts: Vec<String> = k
                .params
                .iter()
                .zip(k.codes.chars())
                .filter(|(_, c)| matches!(c, 'i' | 'o'))
                .map(|(p, _)| pointee_dtype(p).map_or("None".to_string(), |d| format!("Some(DType::{d})")))
                .collect();
            let outs: u64 = k.codes.chars().filter(|c| matches!(c, 'i' | 'o')).enumerate().map(|(j, c)| if c == 'o' { 1u64 << j } else { 0 }).sum();
            let n_ptrs = ptr_dts.len();
            assert!(n_ptrs <= 16, "kernel {} has {n_ptrs} pointer parameters; the launch path takes at most 16", k.name);
            let _ = writeln!(
                table,
                "    Kernel {{ module: {stem:?}, name: {:?}, path: \"{stem}/{}\", codes: {:?}, ptr_dtypes: &[{}], outs: {outs:#x} }},",
                k.name,
                k.name,
                k.codes,
                ptr_dts.join(", ")
            );
            match families.iter_mut().find(|(f, _)| *f == fam) {
                Some((_, v)) => v.push((id, dts, k)),
                None => families.push((fam, vec![(id, dts, k)])),
            }
            id += 1;
        }
        let _ = writeln!(modules, "/// The kernels of `cuda/{stem}.cu`.\npub mod {stem} {{\n    #[allow(unused_imports)]\n    use super::*;\n");
        for (fam, members) in &families {
            let params_of = |k: &KernelSig| -> Vec<RustParam> {
                k.params.iter().zip(k.codes.chars()).enumerate().map(|(i, (p, c))| rust_param(p, c, i, &k.name)).collect()
            };
            let first = params_of(members[0].2);
            let n_dts = members[0].1.len();
            let uniform =
                members.iter().all(|(_, d, k)| d.len() == n_dts && params_of(k).iter().map(|p| (&p.ty, p.pack)).eq(first.iter().map(|p| (&p.ty, p.pack))))
                    && (n_dts > 0 || members.len() == 1);
            if uniform {
                write_fn(&mut modules, &mut check, stem, fam, members, &first);
            } else {
                for m in members {
                    write_fn(&mut modules, &mut check, stem, &m.2.name, &[(m.0, Vec::new(), m.2)], &params_of(m.2));
                }
            }
        }
        modules.push_str("}\n\n");
    }
    let mut s = String::from("// Generated by build.rs from the `extern \"C\" __global__` signatures of cuda/*.cu.\n\n");
    let _ =
        writeln!(s, "/// Every kernel of `cuda/*.cu`, by id (the index the launch functions use).\npub static KERNEL_TABLE: [Kernel; {id}] = [\n{table}];\n");
    s.push_str(&modules);
    let dst = out_dir.join("bindings.rs");
    std::fs::write(&dst, s).unwrap_or_else(|e| panic!("cannot write {}: {e}", dst.display()));
    // For kernels::tests: each kernel's path and the C kinds the Rust types of its function's parameters accept.
    let c = format!("/// (kernel path, per parameter the C kinds its Rust type accepts).\nfn rust_param_kinds() -> Vec<(&'static str, Vec<&'static [u8]>)> {{\n    vec![\n{check}    ]\n}}\n");
    let dst = out_dir.join("bindings_check.rs");
    std::fs::write(&dst, c).unwrap_or_else(|e| panic!("cannot write {}: {e}", dst.display()));
}

/// One kernel of a family: (kernel id, dtypes, signature).
type Member<'a> = (usize, Vec<&'static str>, &'a KernelSig);

/// One generated launch function.
fn write_fn(out: &mut String, check: &mut String, stem: &str, fname: &str, members: &[Member], params: &[RustParam]) {
    use std::fmt::Write;
    let kinds: Vec<String> = params.iter().map(|p| format!("<{} as Accepts>::CODES", p.ty)).collect();
    for (_, _, k) in members {
        let _ = writeln!(check, "        (\"{stem}/{}\", vec![{}]),", k.name, kinds.join(", "));
    }
    let n_dts = members[0].1.len();
    let dt_names: &[&str] = match n_dts {
        0 => &[],
        1 => &["dt"],
        2 => &["dt", "dt_to"],
        n => panic!("asrforge: kernel {} has {n} dtype words in its name; the bindings take at most 2", members[0].2.name),
    };
    let carries = params.iter().any(|p| p.carries);
    let protos: Vec<String> = members.iter().map(|(_, _, k)| format!("`{}({})`", k.name, k.params.join(", "))).collect();
    let _ = writeln!(out, "    /// Launches {} of `cuda/{stem}.cu`{}.", protos.join(", "), if n_dts > 0 { ", the dtype choosing the kernel" } else { "" });
    if carries {
        let _ = writeln!(out, "    /// `moved`: the bytes the buffers of its by-value table read and write (for the step profile).");
    }
    let mut sig = String::from("dev: &CudaDevice");
    for d in dt_names {
        let _ = write!(sig, ", {d}: DType");
    }
    sig.push_str(", cfg: LaunchConfig");
    for p in params {
        let _ = write!(sig, ", {}: {}", p.name, p.ty);
    }
    if carries {
        sig.push_str(", moved: (u64, u64)");
    }
    let _ = writeln!(out, "    #[allow(clippy::too_many_arguments, non_snake_case)]\n    pub fn {fname}({sig}) -> Result<()> {{");
    // Pick the kernel.
    if n_dts == 0 {
        let _ = writeln!(out, "        let id = {};", members[0].0);
    } else {
        let scrut = if n_dts == 1 { "dt".to_string() } else { "(dt, dt_to)".to_string() };
        let _ = writeln!(out, "        let id = match {scrut} {{");
        let mut have = Vec::new();
        for (id, dts, _) in members {
            let pat: Vec<String> = dts.iter().map(|d| format!("DType::{d}")).collect();
            let pat = if n_dts == 1 { pat[0].clone() } else { format!("({})", pat.join(", ")) };
            let _ = writeln!(out, "            {pat} => {id},");
            have.push(dts.iter().map(|d| d.to_lowercase()).collect::<Vec<_>>().join("→"));
        }
        let dts_expr = dt_names.join(", ");
        // Every dtype (combination) has a kernel: the match is exhaustive.
        if members.len() < DTYPE_WORDS.len().pow(n_dts as u32) {
            let _ = writeln!(out, "            _ => return Err(no_kernel(\"{stem}/{fname}\", &[{dts_expr}], {:?})),", have.join(", "));
        }
        let _ = writeln!(out, "        }};");
    }
    let _ = writeln!(out, "        let k = &KERNEL_TABLE[id];");
    // Check and pack the arguments.
    let ptrs: Vec<&str> = params.iter().filter(|p| p.pack == "ptr").map(|p| p.name.as_str()).collect();
    let _ = writeln!(out, "        let bufs: [&CudaStorage; {}] = [{}];", ptrs.len(), ptrs.join(", "));
    let _ = writeln!(out, "        check_bufs(dev, k, &bufs)?;");
    for (i, p) in params.iter().enumerate() {
        let v = match p.pack {
            "ptr" => format!("{}.ptr()", p.name),
            "acc" => format!("acc_word(k, {i}, {})", p.name),
            "words" => continue,
            _ => p.name.clone(),
        };
        let _ = writeln!(out, "        let mut a{i} = {v};");
    }
    let args: Vec<String> = params
        .iter()
        .enumerate()
        .map(|(i, p)| if p.pack == "words" { format!("{}.as_ptr() as *mut c_void", p.name) } else { format!("param(&mut a{i})") })
        .collect();
    let _ = writeln!(out, "        let mut params: [*mut c_void; {}] = [{}];", params.len(), args.join(", "));
    let moved = if carries { "Some(moved)" } else { "None" };
    let _ = writeln!(
        out,
        "        // SAFETY: `k` is this function's kernel, whose C parameters are the\n        // ones above in order, kind and size (generated from its signature);\n        // each entry of `params` points at a live local of the parameter's\n        // type or at the caller's words (`&[u64; N]` of the struct's size),\n        // all of which outlive the call; `check_bufs` checked every buffer\n        // is on `dev`.\n        unsafe {{ dev.launch_kernel(id, cfg, &mut params, &bufs, {moved}) }}\n    }}\n"
    );
}
