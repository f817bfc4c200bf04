//! `vmm`: boot a kernel from flags (used by the benchmark and for manual runs).
//!
//! ```text
//! vmm --kernel PATH [--initrd PATH] [--mem-mib N] [--vcpus N] [--cmdline S]
//!     [--cpu-profile auto|host|baseline] [--raw] [--quiet]
//! vmm --tiny-reset [--mem-mib N] [--vcpus N]
//! ```
//! Console output goes to stdout (unless `--quiet`). Exit status: 0 when the guest resets or
//! powers off, 2 on a triple fault, 3 on a halt, 1 on errors and guest faults.

use std::path::PathBuf;
use std::process::ExitCode;

use vm_error_chain::error_chain;
use vmm::{ConsoleConfig, CpuProfile, KernelFormat, Vm, VmConfig, VmExit};

/// 64-bit code that resets the machine through the i8042 at once:
/// `mov al, 0xfe ; out 0x64, al ; hlt`.
const TINY_RESET: &[u8] = &[0xb0, 0xfe, 0xe6, 0x64, 0xf4];

const USAGE: &str = "usage: vmm (--kernel PATH | --tiny-reset) [--initrd PATH] [--mem-mib N] [--vcpus N] \
[--cmdline S] [--cpu-profile auto|host|baseline] [--raw] [--quiet]";

struct Args {
    cfg: VmConfig,
    tiny_reset: bool,
    quiet: bool,
}

fn value(it: &mut impl Iterator<Item = String>, flag: &str) -> Result<String, String> {
    it.next().ok_or_else(|| format!("{flag} needs a value"))
}

fn number<T: std::str::FromStr>(s: &str, flag: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("{flag}: not a number: {s}"))
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        cfg: VmConfig::default(),
        tiny_reset: false,
        quiet: false,
    };
    let mut kernel = None;
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--kernel" => kernel = Some(PathBuf::from(value(&mut it, &flag)?)),
            "--initrd" => a.cfg.initrd = Some(PathBuf::from(value(&mut it, &flag)?)),
            "--mem-mib" => a.cfg.mem_mib = number(&value(&mut it, &flag)?, &flag)?,
            "--vcpus" => a.cfg.vcpus = number(&value(&mut it, &flag)?, &flag)?,
            "--cmdline" => a.cfg.cmdline = value(&mut it, &flag)?,
            "--cpu-profile" => {
                let v = value(&mut it, &flag)?;
                a.cfg.cpu_profile =
                    CpuProfile::parse(&v).ok_or_else(|| format!("unknown cpu profile {v}"))?;
            }
            "--raw" => a.cfg.kernel_format = KernelFormat::Raw,
            "--tiny-reset" => a.tiny_reset = true,
            "--quiet" => a.quiet = true,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    match (kernel, a.tiny_reset) {
        (Some(k), false) => a.cfg.kernel = k,
        (None, true) => {}
        _ => return Err(USAGE.to_string()),
    }
    Ok(a)
}

fn run(mut a: Args) -> Result<VmExit, String> {
    let mut tiny_file = None;
    if a.tiny_reset {
        let path = std::env::temp_dir().join(format!("vmm-tiny-reset-{}.bin", std::process::id()));
        std::fs::write(&path, TINY_RESET)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        a.cfg.kernel = path.clone();
        a.cfg.kernel_format = KernelFormat::Raw;
        tiny_file = Some(path);
    }
    let mut console = ConsoleConfig::default();
    if !a.quiet {
        console.sink = Some(Box::new(std::io::stdout()));
    }
    let created = Vm::create_with_console(a.cfg, console);
    if let Some(p) = tiny_file {
        let _ = std::fs::remove_file(p);
    }
    let vm = created.map_err(|e| error_chain(&e))?;
    let running = vm.start().map_err(|e| error_chain(&e))?;
    running.wait().map_err(|e| error_chain(&e))
}

fn main() -> ExitCode {
    vmm::logger::init();
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    match run(args) {
        Ok(VmExit::Reset | VmExit::PowerOff | VmExit::Stopped) => ExitCode::SUCCESS,
        Ok(VmExit::TripleFault) => {
            eprintln!("vmm: guest triple fault");
            ExitCode::from(2)
        }
        Ok(VmExit::Halted) => {
            eprintln!("vmm: guest halted");
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("vmm: {e}");
            ExitCode::from(1)
        }
    }
}
