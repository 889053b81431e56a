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
    let emu = build_emu(&out_dir, &src_dir, &sources);
    let archs = parse_archs();
    let arch_list = archs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",");
    let nvcc = match find_nvcc() {
        Some(n) => n,
        None => {
            println!(
                "cargo:warning=asrforge: nvcc not found (looked at NVCC, CUDA_HOME/CUDA_PATH/CUDA_ROOT + /bin/nvcc, PATH); building without CUDA kernels. Install it with scripts/install-nvcc.sh"
            );
            write_index(&out_dir, &[], "", &emu);
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
    write_index(&out_dir, &built, &arch_list, &emu);
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

fn write_index(out_dir: &Path, built: &[(String, PathBuf)], archs: &str, emu: &EmuBuild) {
    let mut s = String::from("/// Embedded kernel modules: (file stem, fatbin).\npub static KERNELS: &[(&str, &[u8])] = &[\n");
    for (stem, path) in built {
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
    s.push_str("/// Every kernel's parameter kinds from its `extern \"C\" __global__` signature: (module stem, kernel,\n/// one code per parameter: `i` const pointer, `o` pointer, `4`/`8` integer, `f` float, `d` double, `s` struct),\n/// sorted; empty when no C++ compiler scanned the sources.\npub static SIGNATURES: &[(&str, &str, &str)] = &[\n");
    for (stem, k, codes) in &emu.signatures {
        s.push_str(&format!("    ({stem:?}, {k:?}, {codes:?}),\n"));
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
    /// (module stem, kernel, parameter codes) of every project kernel, sorted.
    signatures: Vec<(String, String, String)>,
}

/// Compiles every `cuda/<stem>.cu`, unchanged, with g++ and the force-included
/// `cuda/emu/emu.h` into `$OUT_DIR/emu/lib<stem>.so` (kernel table generated
/// from `g++ -E`, runtime from `cuda/emu/runtime.cpp`). A missing or old g++
/// warns and builds none; a g++ error fails the build with g++'s messages.
fn build_emu(out_dir: &Path, src_dir: &Path, sources: &[PathBuf]) -> EmuBuild {
    let dir = out_dir.join("emu");
    let none = |problem: String| {
        println!("cargo:warning=asrforge: {problem}; the emulated CUDA device (ASRFORGE_CUDA_EMU=1) is unavailable");
        EmuBuild { dir: dir.clone(), modules: Vec::new(), problem, signatures: Vec::new() }
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
    let mut units: Vec<(PathBuf, PathBuf)> = sources.iter().map(|s| (s.clone(), dir.clone())).collect();
    let test_dir = dir.join("testdata");
    if let Ok(rd) = std::fs::read_dir(emu_src.join("testdata")) {
        if let Err(e) = std::fs::create_dir_all(&test_dir) {
            panic!("cannot create {}: {e}", test_dir.display());
        }
        let mut extra: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "cu")).collect();
        extra.sort();
        units.extend(extra.into_iter().map(|p| (p, test_dir.clone())));
    }
    for (src, out) in &units {
        let (cxx, emu_src, src_dir, out, src) = (cxx.clone(), emu_src.clone(), src_dir.to_path_buf(), out.clone(), src.clone());
        jobs.push(std::thread::spawn(move || emu_module(&cxx, &emu_src, &src_dir, &out, &src).map(|(stem, sigs)| Some((stem, out, sigs)))));
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
        .map(|(stem, out, _)| {
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
    let mut stems = Vec::new();
    let mut signatures = Vec::new();
    for (stem, _, sigs) in built.into_iter().filter(|(_, out, _)| *out == dir) {
        signatures.extend(sigs.into_iter().map(|(k, codes)| (stem.clone(), k, codes)));
        stems.push(stem);
    }
    stems.sort();
    signatures.sort();
    EmuBuild { dir, modules: stems, problem: String::new(), signatures }
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

/// Scans `src` (preprocessed), writes its table `<stem>_emu.cpp` and compiles it to `<stem>.o`.
fn emu_module(cxx: &Path, emu_src: &Path, src_dir: &Path, dir: &Path, src: &Path) -> Result<(String, Vec<(String, String)>), String> {
    let stem = src.file_stem().and_then(|s| s.to_str()).ok_or_else(|| format!("{}: not a UTF-8 file name", src.display()))?.to_string();
    let include = |cmd: &mut Command| {
        cmd.arg("-include").arg(emu_src.join("emu.h"));
        cmd.arg(format!("-I{}", src_dir.display())).arg(format!("-I{}", emu_src.join("include").display()));
    };
    let mut pre = emu_cxx(cxx, emu_src);
    pre.args(["-E", "-P", "-x", "c++", "-DASRFORGE_EMU_SCAN"]);
    include(&mut pre);
    pre.arg(src);
    let res = pre.output().map_err(|e| format!("cannot run {}: {e}", cxx.display()))?;
    if !res.status.success() {
        return Err(format!("g++ -E failed on {} ({}):\n{}", src.display(), res.status, String::from_utf8_lossy(&res.stderr)));
    }
    let scan = scan_cu(&String::from_utf8_lossy(&res.stdout));
    let table = dir.join(format!("{stem}_emu.cpp"));
    std::fs::write(&table, emu_table(src, &scan)).map_err(|e| format!("cannot write {}: {e}", table.display()))?;
    let mut cmd = emu_cxx(cxx, emu_src);
    cmd.args(["-x", "c++"]);
    include(&mut cmd);
    cmd.arg("-c").arg("-o").arg(dir.join(format!("{stem}.o"))).arg(&table);
    run_cxx(cmd, &src.display().to_string())?;
    Ok((stem, scan.signatures))
}

/// What the table needs from one preprocessed `.cu`.
#[derive(Default)]
struct CuScan {
    /// `extern "C" __global__` functions: (namespace path, name).
    kernels: Vec<(Vec<String>, String)>,
    /// Each kernel's parameter kinds (one code per parameter, see `param_code`), by name.
    signatures: Vec<(String, String)>,
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
                        out.signatures.push((name.clone(), signature_codes(params)));
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
    parts.into_iter().map(str::trim).filter(|p| !p.is_empty() && *p != "void").map(param_code).collect()
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
