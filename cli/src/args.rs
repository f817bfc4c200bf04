//! The command-line grammar (clap derive). Only shapes and help texts live here.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::parse::{self, EnvArg, VolumeArg};

const MAIN_AFTER: &str = "Examples:
  vm exec --allow-emulation -- sh -c 'echo hi; exit 7'
  vm exec --memory 512M -v $PWD/data:/data:ro -- ls /data
  vm run -d --name box --allow-emulation && vm exec box -- uname -a && vm stop box
  vm serve -p 8000 --allow-emulation -- httpd -f -p 8000
  vm drivers
  vm mcp --allow-emulation                        # sandboxes as MCP tools for an agent host
  vm -vv exec --allow-emulation -- true        # debug logging (-q/-v go before the command)

Environment:
  VM_RUNTIME_DIR  state of named VMs (default $XDG_RUNTIME_DIR/vm, /run/user/$UID/vm or /tmp/vm-$UID/vm)
  VM_IMAGES_DIR   guest images (default ${XDG_CACHE_HOME:-$HOME/.cache}/vm/images)
  RUST_LOG        log filter, overrides -q/-v

";

/// Run untrusted work inside lightweight microVMs.
#[derive(Debug, Parser)]
#[command(name = "vm", version, about = "Run untrusted work inside lightweight microVMs", after_help = format!("{MAIN_AFTER}{}", crate::exit::HELP_TABLE))]
pub struct Cli {
    /// Only print errors (give it before the command: `vm -q exec …`).
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,
    /// More logging on stderr: -v info, -vv debug, -vvv trace (before the command: `vm -v exec …`;
    /// after it, -v is a mount).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    Exec(ExecArgs),
    Run(RunArgs),
    Serve(ServeArgs),
    Ps(PsArgs),
    Stats(StatsArgs),
    Stop(StopArgs),
    Pause(PauseArgs),
    Unpause(UnpauseArgs),
    Rm(RmArgs),
    Logs(LogsArgs),
    Cp(CpArgs),
    Drivers(DriversArgs),
    #[command(subcommand)]
    Images(ImagesCommand),
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    Mcp(crate::cmd::mcp::McpArgs),
    /// Internal: the detached supervisor of a `vm run -d` VM.
    #[command(name = "__supervise", hide = true)]
    Supervise(SuperviseArgs),
}

/// Trust level of the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrustArg {
    /// Your own code; any driver will do.
    Trusted,
    /// Semi-trusted code.
    Semi,
    /// Untrusted code: needs a microVM, or --allow-emulation for an emulated VM.
    Untrusted,
}

/// Options that describe a VM to boot (shared by exec, run and serve).
#[derive(Debug, Clone, Args, serde::Serialize, serde::Deserialize)]
pub struct VmOpts {
    /// Guest memory: a number with K/M/G suffix, MiB when bare [default: 256M]
    #[arg(long, value_name = "SIZE", value_parser = parse::mem_mib)]
    pub memory: Option<i64>,
    /// Number of vCPUs [default: 1]
    #[arg(long, value_name = "N")]
    pub cpus: Option<i64>,
    /// Maximum number of processes in the guest [default: 256]
    #[arg(long, value_name = "N")]
    pub pids: Option<i64>,
    /// Wall lifetime of the VM (s/m/h, seconds when bare); the VM is torn down at expiry
    #[arg(long, value_name = "DURATION", value_parser = parse::duration)]
    pub timeout: Option<Duration>,
    /// Mount a host path read-only: HOST:GUEST[:ro] (`:rw` is refused for untrusted work),
    /// served in place by a jailed read-only file server; `:ro,erofs` copies a directory into
    /// an erofs image instead (no file server on the host side)
    #[arg(short = 'v', long = "volume", value_name = "HOST:GUEST[:ro[,erofs]]", value_parser = parse::volume)]
    pub volumes: Vec<VolumeArg>,
    /// Each read-only mount's DAX window on kvm, through which the guest maps the host's page
    /// cache (one copy for every VM): K/M/G suffix, MiB when bare, a multiple of 2M; 0 for
    /// none (the guest reads into its own page cache). Refused on a driver without DAX (tcg)
    /// [default: 1G, or 4 times the memory when that is less]
    #[arg(long = "dax-window", value_name = "SIZE", value_parser = parse::mem_mib)]
    pub dax_window: Option<i64>,
    /// Mount this host path even though it is or holds credentials (~/.ssh, ~/.aws, …)
    #[arg(long = "allow-mount-secret", value_name = "PATH")]
    pub allow_mount_secret: Vec<PathBuf>,
    /// Guest kernel (vmlinux or bzImage) instead of the built-in image's
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Guest initramfs instead of the built-in image's
    #[arg(long, value_name = "PATH")]
    pub initrd: Option<PathBuf>,
    /// Root filesystem image (erofs or ext4, read-only): every command runs in it, writes go
    /// to a tmpfs overlay that vanishes with the VM
    #[arg(long, value_name = "PATH", conflicts_with = "image")]
    pub rootfs: Option<PathBuf>,
    /// OCI image as the guest's root: NAME:TAG, NAME@sha256:DIGEST or a stored name/digest
    /// (pulled and converted when missing, see `vm images`); its Env, WorkingDir, User,
    /// Entrypoint and Cmd are the defaults
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// Use this driver (kvm, tcg, hvf, hyperv) instead of the first available one
    #[arg(long, value_name = "NAME")]
    pub driver: Option<String>,
    /// Trust level of the work
    #[arg(long, value_enum, default_value = "untrusted")]
    pub trust: TrustArg,
    /// Accept an emulated VM (tcg: a full guest kernel, but not a hardware-virtualized boundary)
    #[arg(long)]
    pub allow_emulation: bool,
    /// Accept running the VM's host processes without their jail (namespaces, own uid, no
    /// capabilities, seccomp) when this host cannot build it, e.g. when not root
    #[arg(long)]
    pub allow_weaker_jail: bool,
}

impl VmOpts {
    /// `--dax-window` in MiB, as [`vm_sandbox::Options::dax_window_mib`] takes it (a size past
    /// `u32` MiB stays too large, for the driver to refuse by name).
    pub fn dax_window_mib(&self) -> Option<u32> {
        self.dax_window
            .map(|m| u32::try_from(m).unwrap_or(u32::MAX))
    }
}

/// Options for the command run in the guest.
#[derive(Debug, Clone, Args)]
pub struct CmdOpts {
    /// Set a guest environment variable (KEY=VALUE), or forward the host's (KEY)
    #[arg(short = 'e', long = "env", value_name = "KEY[=VALUE]", value_parser = parse::env)]
    pub env: Vec<EnvArg>,
    /// Pass this variable even though its name or value looks like a secret
    #[arg(long = "env-allow", value_name = "NAME")]
    pub env_allow: Vec<String>,
    /// Working directory of the command in the guest: relative to the guest root (/work), or any
    /// absolute guest path
    #[arg(short = 'w', long = "workdir", value_name = "DIR")]
    pub workdir: Option<String>,
    /// Run commands as this guest user: NAME, UID, NAME:GROUP or UID:GID (names from the root's
    /// /etc/passwd and /etc/group) [default: the image's User, else root]
    #[arg(short = 'u', long = "user", value_name = "USER")]
    pub user: Option<String>,
}

/// Dry-run options.
#[derive(Debug, Clone, Args)]
pub struct DryRunOpts {
    /// Print the resolved spec and the validation verdict; boot nothing
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: print JSON instead of text
    #[arg(long, requires = "dry_run")]
    pub json: bool,
}

/// Boot a VM, run one command in it, tear it down (or run in a named VM).
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vm exec --allow-emulation -- sh -c 'echo hi; exit 7'      # prints hi, exits 7
  vm exec --memory 1G --cpus 2 --timeout 5m -- make -j2
  vm exec -v /srv/data:/data:ro -e TOKEN -e MODE=fast -w /data -- ./run.sh
  vm exec --dry-run --json -- true                          # show the resolved spec, boot nothing
  vm exec box -- ls /                                       # run in the running VM `box`
  printf 'a\nb\n' | vm exec -i -- wc -l                      # stdin streamed to the command
  vm exec -it box -- sh                                     # an interactive shell in `box`
  vm exec --rootfs py.erofs --user 1000 -- python3 app.py   # an image file as the guest's root
  vm exec --image 127.0.0.1:5000/python:3.11 -- python3 -V  # an OCI image as the guest's root

The command's stdout and stderr are streamed as they come; vm exits with its exit code
(128+N when killed by signal N). Ctrl-C cancels the whole guest command tree and exits 130.
Without -i the command's stdin is empty (/dev/null). -t runs it on a pseudo-terminal in the
guest (output is all stdout, TERM is passed, the window size follows ours); with -it our
terminal is in raw mode for the session and Ctrl-C is sent to the guest as a key.
With --rootfs or --image, commands run inside that image (writes vanish with the VM); with no command,
the image's Entrypoint + Cmd run. With NAME, only -e, --env-allow, -w, --user and --timeout
(which then bounds the command) apply: the VM was configured by `vm run`.")]
pub struct ExecArgs {
    /// Run in this running VM (see `vm run -d`) instead of booting one
    #[arg(value_name = "NAME")]
    pub name: Option<String>,
    /// Restore this snapshot (see `vm snapshot create`) instead of booting: its memory, mounts,
    /// environment and image are the snapshot's
    #[arg(long, value_name = "SNAPSHOT", conflicts_with = "name")]
    pub from: Option<String>,
    #[command(flatten)]
    pub vm: VmOpts,
    #[command(flatten)]
    pub cmd: CmdOpts,
    #[command(flatten)]
    pub dry: DryRunOpts,
    /// Stream stdin to the command until EOF (without -i its stdin is empty)
    #[arg(short = 'i', long)]
    pub interactive: bool,
    /// Run the command on a pseudo-terminal in the guest (stdin must be a terminal)
    #[arg(short = 't', long)]
    pub tty: bool,
    /// The command and its arguments, after `--` (none: the image's Entrypoint + Cmd)
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Start a long-lived named VM in the background.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vm run -d --name box --allow-emulation --memory 512M --timeout 2h
  vm exec box -- sh -c 'echo $((6*7))'
  vm cp ./script.sh box:/tmp/script.sh && vm exec box -- sh /tmp/script.sh
  vm stop box && vm rm box

Returns once the VM's agent answers. The VM is held by a detached supervisor until
`vm stop NAME` or its wall lifetime (--timeout) ends. -e sets the environment of every
command run in it, -w the default working directory of `vm exec NAME`. State (record,
supervisor.log, console.log) is kept in $VM_RUNTIME_DIR/NAME/ until `vm rm NAME`.")]
pub struct RunArgs {
    /// Run in the background (required: a foreground run is `vm exec`)
    #[arg(short = 'd', long)]
    pub detach: bool,
    /// Name of the VM ([a-z0-9][a-z0-9_.-]{0,62})
    #[arg(long, value_parser = parse::vm_name)]
    pub name: String,
    /// Restore this snapshot (see `vm snapshot create`) instead of booting: its memory, mounts,
    /// environment and image are the snapshot's
    #[arg(long, value_name = "SNAPSHOT")]
    pub from: Option<String>,
    #[command(flatten)]
    pub vm: VmOpts,
    #[command(flatten)]
    pub cmd: CmdOpts,
    #[command(flatten)]
    pub dry: DryRunOpts,
}

/// Start a server in a VM and publish its ports on the host.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vm serve -p 8000 --allow-emulation -- httpd -f -p 8000             # 127.0.0.1:8000 -> guest 8000
  vm serve --name tiny --image onnx-server -v ./models:/models:ro -p 0:8000 --ready /health
  vm serve -p 8000-8003:8000-8003 -p 9000:80 -- server                  # several ports, a range
  vm serve -p 0.0.0.0:8000:8000 -- server                               # exposed to the network
  vm serve -p 8000 --dry-run --json -- server                           # show normalized publish specs
  vm logs tiny ; vm stop tiny ; vm rm tiny                              # from another shell

Publish specs: PORT, HOSTPORT:GUESTPORT or IP:HOSTPORT:GUESTPORT (TCP), each port may be a
range FIRST-LAST (host and guest ranges of equal length; host 0 = a free port for each);
the host side binds to 127.0.0.1 unless an address is written out. vm waits until every
published guest port accepts connections (and, with --ready PATH, until GET PATH on the
first one answers 2xx), then prints one URL per published port on stdout. If the server
exits first or --ready-timeout passes, vm prints the console and server-log tails and exits
non-zero. Ctrl-C or `vm stop NAME` stops the server and the VM; if the server exits by
itself, vm exits with its exit code. `vm logs NAME` shows the server's output (--console:
the VM's console). Without --name the VM is named serve-PID and its record is removed when
it ends; with --name it stays (exited) until `vm rm NAME`. -w does not apply.")]
pub struct ServeArgs {
    /// Publish guest ports on the host: [IP:]HOSTPORT:GUESTPORT or PORT, ports or ranges
    /// (HOSTPORT 0 = any free port); repeatable
    #[arg(
        short = 'p',
        long = "publish",
        value_name = "[IP:]HOSTPORT:GUESTPORT",
        required = true
    )]
    pub publish: Vec<String>,
    /// Name of the VM, for `vm logs`, `vm stop`, `vm exec NAME` ([a-z0-9][a-z0-9_.-]{0,62})
    #[arg(long, value_parser = parse::vm_name)]
    pub name: Option<String>,
    /// Restore this snapshot (see `vm snapshot create`) instead of booting, then start the
    /// server in it: its memory, mounts, environment and image are the snapshot's. With no
    /// CMD, a snapshot taken serving (`vm snapshot create -p`) publishes its own server
    #[arg(long, value_name = "SNAPSHOT")]
    pub from: Option<String>,
    /// Ready only when GET PATH on the first published port answers 2xx (e.g. /health)
    #[arg(long, value_name = "PATH", value_parser = parse::http_path)]
    pub ready: Option<String>,
    /// How long to wait for the server to be ready
    #[arg(long, value_name = "DURATION", value_parser = parse::duration, default_value = "300s")]
    pub ready_timeout: std::time::Duration,
    #[command(flatten)]
    pub vm: VmOpts,
    #[command(flatten)]
    pub cmd: CmdOpts,
    #[command(flatten)]
    pub dry: DryRunOpts,
    /// The server command and its arguments, after `--` (none: the image's Entrypoint + Cmd)
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// List named VMs.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vm ps
  vm ps --json | jq '.[] | select(.state == \"running\") | .name'

A VM whose supervisor is gone is shown as exited and its leftovers are cleaned.")]
pub struct PsArgs {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// Show what named VMs cost the host: CPU over a 1 s sample, memory, processes.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vm stats
  vm stats --json box | jq '.[0].host_rss_bytes'

HOST MEM is the resident memory of every host process of the VM (the guest RAM it has touched
plus the VMM or emulator); GUEST MEM is the guest's memory size. A paused VM uses no CPU.")]
pub struct StatsArgs {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
    /// VM names (default: every running or paused VM)
    #[arg(value_parser = parse::vm_name)]
    pub names: Vec<String>,
}

/// Stop a named VM.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vm stop box
  vm stop --time 2 box a b

Asks the supervisor to stop (SIGTERM), waits, then kills it and the VM (SIGKILL).")]
pub struct StopArgs {
    /// Seconds to wait for a clean stop before killing
    #[arg(short = 't', long = "time", default_value_t = 10)]
    pub time: u64,
    /// VM names
    #[arg(required = true, value_parser = parse::vm_name)]
    pub names: Vec<String>,
}

/// Pause named VMs: every host process of the VM is stopped (the guest is frozen).
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vm pause box
  vm exec box -- true      # refused while paused (exit 125)
  vm unpause box

A `vm run -d` VM, or a `vm serve` VM once it is ready (its ports drop new connections while
paused); `vm stop` stops a paused VM too.")]
pub struct PauseArgs {
    /// VM names
    #[arg(required = true, value_parser = parse::vm_name)]
    pub names: Vec<String>,
}

/// Unpause named VMs paused by `vm pause`: the guest carries on where it was.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vm unpause box")]
pub struct UnpauseArgs {
    /// VM names
    #[arg(required = true, value_parser = parse::vm_name)]
    pub names: Vec<String>,
}

/// Remove a stopped VM's record.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vm rm box
  vm rm -f box      # stop it first if it is running")]
pub struct RmArgs {
    /// Stop the VM first if it is running
    #[arg(short, long)]
    pub force: bool,
    /// VM names
    #[arg(required = true, value_parser = parse::vm_name)]
    pub names: Vec<String>,
}

/// Print a named VM's console, or a `vm serve` VM's server output.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vm logs box
  vm logs -f box           # keep following until the VM exits
  vm logs --console web    # a served VM's console instead of its server's output
  vm logs --vmm box        # the log of the VM's own VMM process (kvm driver only)

All are bounded tails (the last 64 KiB of the server's output, the console ring, the
VMM's log), refreshed every second while the VM runs.")]
pub struct LogsArgs {
    /// Keep printing new output until the VM exits
    #[arg(short, long)]
    pub follow: bool,
    /// For a `vm serve` VM: show the VM's console, not the server's output
    #[arg(long, conflicts_with = "vmm")]
    pub console: bool,
    /// Show the log of the VM's `vm-vmm` process (warnings, device errors, how it ended),
    /// not the console; kvm driver only
    #[arg(long)]
    pub vmm: bool,
    /// VM name
    #[arg(value_parser = parse::vm_name)]
    pub name: String,
}

/// Copy a file into or out of a named VM.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vm cp ./input.txt box:/tmp/input.txt
  vm cp box:/tmp/result.json ./result.json
  vm cp box:/etc/os-release -          # to stdout
  vm cp --max-size 4G ./model.gguf box:/models/model.gguf

Exactly one side is NAME:PATH (an absolute guest path). Files stream in bounded chunks: any
size up to --max-size, checked before the copy and again while it runs. Only regular files
are copied (a FIFO or device source is refused). The destination is replaced only once the
copy is complete; all-zero blocks stay holes (sparse files stay sparse).")]
pub struct CpArgs {
    /// Largest file copied (K, M, G, T suffix; MiB when bare)
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse::byte_size)]
    pub max_size: u64,
    /// HOSTFILE or NAME:PATH
    pub src: String,
    /// HOSTFILE or NAME:PATH (`-` for stdout when copying out)
    pub dst: String,
}

/// List the drivers and whether they can run here.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  vm drivers
  vm drivers --json

CONTAINMENT is what a driver's boundary is: microvm (hardware-virtualized) or user-kernel
(an emulated VM: a separate guest kernel, but the emulator runs on the host).")]
pub struct DriversArgs {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// Build, list and prune guest images.
#[derive(Debug, Subcommand)]
pub enum ImagesCommand {
    /// Build the guest kernel and initramfs with images/build.sh
    #[command(after_help = "Examples:
  vm images build
  VM_SOURCE_DIR=~/src/vm vm images build -- --force

Runs <source>/images/build.sh (source tree from VM_SOURCE_DIR or the one vm was built from),
streaming its progress; extra arguments after -- are passed to the script.")]
    Build {
        /// Arguments passed to build.sh
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// List the guest image sets and the OCI images (size, digest, names)
    #[command(after_help = "Examples:
  vm images ls
  vm images ls --json

Guest image sets (kernel + initramfs, from images/build.sh) are listed first, then OCI images
(root filesystems, from `vm images pull/import`). In JSON each entry has \"kind\": \"set\" or \"oci\".")]
    Ls {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Remove image sets other than the current one, unnamed OCI images and abandoned builds
    #[command(after_help = "Examples:
  vm images prune")]
    Prune,
    /// Pull an OCI image from a registry and convert it to a read-only erofs root
    #[command(after_help = "Examples:
  vm images pull 127.0.0.1:5000/python:3.11
  vm images pull registry.example.com/team/server@sha256:<64 hex>

Manifest lists resolve to linux/amd64. Loopback registries are reached over plain HTTP,
all others over HTTPS; credentials come from the docker config.json ($DOCKER_CONFIG or
~/.docker). The image is cached by manifest digest in $VM_OCI_DIR (default: oci/ next to the
guest image directory); an image already there is not fetched again.")]
    Pull {
        /// Image reference: NAME[:TAG] or NAME@sha256:DIGEST
        reference: String,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Import an OCI image layout directory, an oci-archive or a docker save tarball
    #[command(after_help = "Examples:
  vm images import ./layout-dir
  vm images import image.oci.tar --name 127.0.0.1:5000/mine:1
  docker save busybox:latest -o busybox.tar && vm images import busybox.tar")]
    Import {
        /// Directory or tarball (gzipped or not)
        path: std::path::PathBuf,
        /// Also name the image REF (repeatable)
        #[arg(long = "name", value_name = "REF")]
        names: Vec<String>,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Remove OCI images by name or digest
    #[command(after_help = "Examples:
  vm images rm 127.0.0.1:5000/python:3.11
  vm images rm sha256:3f1c...   (a unique prefix of 6+ hex digits is enough)

A name is removed, and the image with it when no other name points at it; a digest removes
the image and all its names.")]
    Rm {
        /// Names or digests
        #[arg(required = true)]
        images: Vec<String>,
    },
}

/// Snapshots: a VM saved after its boot (and a warm-up command), restored in milliseconds.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Boot a VM, run an optional warm-up command, and save it as the snapshot NAME
    #[command(after_help = "Examples:
  vm snapshot create base
  vm snapshot create py --image 127.0.0.1:5000/python:3.11 --memory 512M -- python3 -c 'import numpy'
  vm exec --from py -- python3 -c 'import numpy; print(numpy.__version__)'
  vm snapshot create web -p 8000 --ready / -- httpd -f -p 8000 -h /srv
  vm serve --from web -p 0:8000                # the snapshot's httpd, answering at once

The VM boots as `vm exec` would boot it; the warm-up command (if any) must exit 0 (with -p it
is a server instead, and the snapshot is taken once its ports answer), then the VM
is paused and written to ${XDG_CACHE_HOME:-$HOME/.cache}/vm/snapshots/NAME (or $VM_SNAPSHOTS_DIR)
and ended. Its memory, mounts, environment and wall limit are recorded with it: every VM
restored from it gets them again, and each mounted file must be unchanged at restore.
Snapshots need the kvm driver (`vm drivers` says why another cannot).")]
    Create(Box<SnapshotCreateArgs>),
    /// List snapshots
    Ls {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Remove snapshots (VMs restored from one keep running)
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// `vm snapshot create` arguments.
#[derive(Debug, Args)]
pub struct SnapshotCreateArgs {
    /// The snapshot's name
    pub name: String,
    /// Serve CMD instead of running it to its end: start it as `vm serve` does and take the
    /// snapshot once this guest port accepts (and `--ready` answers); repeatable. The server
    /// runs on in every VM restored from the snapshot (`vm serve --from NAME -p HOSTPORT:GUESTPORT`)
    #[arg(short = 'p', long = "port", value_name = "GUESTPORT",
        value_parser = clap::value_parser!(u16).range(1..))]
    pub ports: Vec<u16>,
    /// With -p: snapshot only once GET PATH on the first port answers 2xx (e.g. /health)
    #[arg(long, value_name = "PATH", value_parser = parse::http_path, requires = "ports")]
    pub ready: Option<String>,
    /// With -p: how long to wait for the server to be ready
    #[arg(long, value_name = "DURATION", value_parser = parse::duration, default_value = "300s")]
    pub ready_timeout: std::time::Duration,
    #[command(flatten)]
    pub vm: VmOpts,
    #[command(flatten)]
    pub cmd: CmdOpts,
    /// The warm-up command (with -p: the server), after `--`
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Internal supervisor arguments.
#[derive(Debug, Args)]
pub struct SuperviseArgs {
    /// VM name (its record must exist)
    pub name: String,
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
