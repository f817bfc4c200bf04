//! A real containerd (Debian's 1.6) for the shim's tests: its own config, root, state and
//! socket in a temp dir (no TCP listener, no CRI), an OCI archive built by the test and
//! imported with `ctr images import`, and `ctr` run against it with our shim as the runtime.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../../oci/tests/common/mod.rs"]
pub mod oci_common;

use oci_common::{Layer, TestImage, tar_dir};

/// Skips (host facts) or fails (no driver: the no-driver rule) before any containerd starts.
#[allow(unused_macros)] // cri.rs has its own (more host facts)
macro_rules! preflight {
    ($name:expr) => {
        if let Some(why) = common::host_cannot() {
            vm_test_support::skip($name, &why);
            return;
        }
        if let Some(why) = common::guest_unavailable() {
            return vm_test_support::no_guest_driver($name, &why);
        }
    };
}

/// The image every test runs: a static busybox and a config with a `PATH`.
pub const IMAGE: &str = "example.com/shim/box:1";

/// The shim under test.
pub fn shim_bin() -> &'static str {
    env!("CARGO_BIN_EXE_containerd-shim-vm-v1")
}

/// Why this host cannot run these tests at all (a fact about the host), if it cannot.
pub fn host_cannot() -> Option<String> {
    for tool in ["containerd", "ctr", "mkfs.erofs"] {
        if !oci_common::have(tool) {
            return Some(format!("{tool} is not installed (ci/setup-tests.sh)"));
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("containerd needs root".into());
    }
    None
}

/// Why no guest can boot here (images or driver missing), if none can.
pub fn guest_unavailable() -> Option<String> {
    if let Err(e) = vm_sandbox::images::default_images() {
        return Some(format!("guest images: {e}"));
    }
    let registry = vm_sandbox::drivers::Registry::with_defaults();
    let policy = vm_spec::Policy {
        allow_emulation: true,
        allow_weaker_jail: false,
    };
    match vm_sandbox::select(&registry, None, vm_spec::Trust::Untrusted, &policy) {
        Ok(_) => None,
        Err(e) => Some(format!("no driver: {e}")),
    }
}

/// Whether untrusted work can boot here without `allow_emulation` (a hardware boundary).
pub fn strict_policy_boots() -> bool {
    let registry = vm_sandbox::drivers::Registry::with_defaults();
    vm_sandbox::select(
        &registry,
        None,
        vm_spec::Trust::Untrusted,
        &vm_spec::Policy::default(),
    )
    .is_ok()
}

/// A finished `ctr` run.
pub use vm_test_support::Out;

/// One containerd and everything it keeps, in one temp dir.
pub struct Containerd {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Containerd {
    /// Starts containerd and imports [`IMAGE`].
    pub fn start() -> Containerd {
        let dir = tempfile::Builder::new()
            .prefix("shim-test-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        for sub in ["root", "state", "run", "snapshots"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let config = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.snapshotter.v1.aufs\", \
             \"io.containerd.snapshotter.v1.btrfs\", \"io.containerd.snapshotter.v1.zfs\", \
             \"io.containerd.snapshotter.v1.devmapper\", \"io.containerd.internal.v1.opt\", \
             \"io.containerd.tracing.processor.v1.otlp\"]\n\
             [grpc]\n  address = \"{sock}\"\n[metrics]\n  address = \"\"\n",
            root = d.join("root").display(),
            state = d.join("state").display(),
            sock = d.join("c.sock").display(),
        );
        std::fs::write(d.join("config.toml"), config).unwrap();
        std::fs::write(
            d.join("shim.toml"),
            format!(
                "allow_emulation = true\nrun_dir = \"{}\"\nsnapshot_cache = \"{}\"\n\
                 kubelet_root = \"{}\"\n",
                d.join("run").display(),
                d.join("snapshots").display(),
                d.display()
            ),
        )
        .unwrap();
        let mut c = Containerd { dir, child: None };
        c.spawn();
        c.import();
        c
    }

    fn spawn(&mut self) {
        let d = self.dir.path();
        let log = append_log(&d.join("containerd.log"));
        let _ = std::fs::remove_file(d.join("c.sock"));
        // The shim inherits containerd's environment (VM_IMAGES_DIR, PATH for qemu).
        let child = Command::new("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.ctr(&["version"]).code != 0 {
            assert!(
                Instant::now() < deadline,
                "containerd did not answer: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops containerd (SIGTERM, as a service manager would) and starts it again on the
    /// same root and state: running shims must be found again.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    pub fn shim_config(&self) -> PathBuf {
        self.dir.path().join("shim.toml")
    }

    /// Parent of the VMs' run directories (from `shim.toml`).
    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// The snapshot root cache (from `shim.toml`).
    pub fn snapshots(&self) -> PathBuf {
        self.dir.path().join("snapshots")
    }

    pub fn ctr_cmd(&self) -> Command {
        let mut c = Command::new("ctr");
        c.arg("-a")
            .arg(self.dir.path().join("c.sock"))
            .args(["-n", "shimtest"])
            .stdin(Stdio::null());
        c
    }

    pub fn ctr(&self, args: &[&str]) -> Out {
        Out::from(self.ctr_cmd().args(args).output().expect("running ctr"))
    }

    /// `ctr run` with our shim and `shim.toml` as its runtime options, not started.
    pub fn run_cmd(&self, flags: &[&str], id: &str, argv: &[&str]) -> Command {
        let mut c = self.ctr_cmd();
        c.args(["run", "--runtime", shim_bin(), "--runtime-config-path"])
            .arg(self.shim_config())
            .args(flags)
            .args([IMAGE, id])
            .args(argv);
        c
    }

    /// `ctr run` with our shim and `shim.toml` as its runtime options.
    pub fn run(&self, flags: &[&str], id: &str, argv: &[&str]) -> Out {
        Out::from(self.run_cmd(flags, id, argv).output().expect("running ctr"))
    }

    /// `ctr run -d` of a container that sleeps (asserted to start).
    pub fn run_detached(&self, id: &str) {
        self.run_detached_with(&[], id);
    }

    /// [`Containerd::run_detached`] with more `ctr run` flags.
    pub fn run_detached_with(&self, flags: &[&str], id: &str) {
        let flags: Vec<&str> = ["-d"].iter().chain(flags).copied().collect();
        let out = self.run(&flags, id, &["sleep", "1000"]);
        assert_eq!(out.code, 0, "{out:?}\n{}", self.log());
    }

    /// `ctr task kill -s SIGKILL`, wait for STOPPED, `ctr task delete`.
    pub fn kill_and_delete(&self, id: &str) {
        let out = self.ctr(&["task", "kill", "-s", "SIGKILL", id]);
        assert_eq!(out.code, 0, "{out:?}");
        self.wait_for(30, "the task to stop", || {
            self.task_status(id).as_deref() == Some("STOPPED")
        });
        let out = self.ctr(&["task", "delete", id]);
        assert_eq!(out.code, 0, "{out:?}");
    }

    fn import(&self) {
        let layout = self.dir.path().join("layout");
        busybox_image().write_layout(&layout, "1");
        let archive = self.dir.path().join("image.tar");
        tar_dir(&layout, &archive);
        let out = self.ctr(&[
            "images",
            "import",
            "--base-name",
            "example.com/shim/box",
            archive.to_str().unwrap(),
        ]);
        assert_eq!(out.code, 0, "ctr images import: {out:?}");
        let ls = self.ctr(&["images", "ls", "-q"]);
        assert!(ls.stdout.lines().any(|l| l == IMAGE), "{ls:?}");
    }

    /// The host pids `ctr task ps` lists for `id` (the VM's processes).
    pub fn task_pids(&self, id: &str) -> Vec<u32> {
        let out = self.ctr(&["task", "ps", id]);
        assert_eq!(out.code, 0, "ctr task ps: {out:?}");
        out.stdout
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect()
    }

    /// The status column of `ctr task ls` for `id`.
    pub fn task_status(&self, id: &str) -> Option<String> {
        let out = self.ctr(&["task", "ls"]);
        out.stdout.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&id)).then(|| f.get(2).unwrap_or(&"").to_string())
        })
    }

    /// Waits until `cond` holds (polling), or panics with `what` after `secs`.
    /// Polls `cond` for `secs` at most; a timeout fails with containerd's log (its tail).
    pub fn wait_for(&self, secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !cond() {
            if Instant::now() >= deadline {
                let log = self.log();
                let tail = tail(&log, 6000);
                panic!("timed out waiting for {what}; containerd's log ends:\n{tail}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The shim processes serving this containerd (their `-address` is our socket). A jailed
    /// VM's reapers are forks of the shim that never exec, so they carry its command line too:
    /// a process whose parent is one of these is the shim's own child, not another shim.
    pub fn shim_pids(&self) -> Vec<u32> {
        shim_pids_for(&self.dir.path().join("c.sock"))
    }
}

/// The shim processes serving the containerd at `sock` (see [`Containerd::shim_pids`]).
pub fn shim_pids_for(sock: &Path) -> Vec<u32> {
    let all = shim_processes_for(sock);
    all.iter()
        .filter(|pid| parent_pid(**pid).is_none_or(|parent| !all.contains(&parent)))
        .copied()
        .collect()
}

/// Every process with a shim's command line for the containerd at `sock`.
fn shim_processes_for(sock: &Path) -> Vec<u32> {
    let sock = sock.to_str().unwrap();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        let is_shim = args
            .first()
            .is_some_and(|a| a.ends_with(b"containerd-shim-vm-v1"));
        if is_shim
            && args
                .windows(2)
                .any(|w| w[0] == b"-address" && w[1] == sock.as_bytes())
        {
            out.push(pid);
        }
    }
    out
}

impl Drop for Containerd {
    /// Ends what this containerd started that is still running (its shims, by pid; their
    /// VMs die with them), then containerd itself.
    fn drop(&mut self) {
        for pid in self.shim_pids() {
            // SAFETY: kill(2) on a shim process this test's containerd started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        self.stop();
    }
}

/// `path` opened for appending (created): containerd's log, its stdout and stderr.
pub fn append_log(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The last `bytes` of `text` at most (from a character boundary).
pub fn tail(text: &str, bytes: usize) -> &str {
    let mut from = text.len().saturating_sub(bytes);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    &text[from..]
}

/// Whether `pid` is a live process (not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s.rsplit(')').next().unwrap_or("").split_whitespace().next();
            !matches!(state, Some("Z" | "X") | None)
        })
        .unwrap_or(false)
}

/// Entries of `dir` (empty when it does not exist).
pub fn entries(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The tests' busybox image: `sh` as its command.
pub fn busybox_image() -> TestImage {
    busybox_image_with(serde_json::json!({"Env": ["PATH=/bin"], "Cmd": ["sh"]}))
}

/// The same static busybox layer (with `httpd` and `wget` too) under another image `config`.
pub fn busybox_image_with(config: serde_json::Value) -> TestImage {
    let busybox = std::fs::read("/bin/busybox").expect("/bin/busybox (busybox-static)");
    let mut l = Layer::new()
        .dir("bin/", 0o755)
        .dir("etc/", 0o755)
        .dir("proc/", 0o755)
        .file_as("bin/busybox", 0o755, (0, 0), &busybox);
    for applet in [
        "sh", "cat", "echo", "sleep", "head", "grep", "id", "ls", "kill", "wc", "stty", "httpd",
        "wget",
    ] {
        l = l.symlink(&format!("bin/{applet}"), "busybox");
    }
    TestImage::new(&[l], config)
}

/// The parent of `pid` (field 4 of `/proc/PID/stat`, after the parenthesised command name).
pub fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}
